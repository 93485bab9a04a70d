"""The structure the design promises, checked on the code itself (ast): one-way imports, no demo code in
the production path, each constant and setting in one place, docs that match the records."""
import ast
import re
from pathlib import Path

import pytest

from builder.core import records

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "builder"
IN_IMAGE = BUILDER / "image" / "scripts"  # stdlib scripts copied into the image, not imported by the tool
# stdlib scripts the tool runs with the base's interpreter in a base container (as text), never imports
IN_CONTAINER = (BUILDER / "engine" / "scripts", BUILDER / "lock" / "scripts")


# The stage packages, lowest first: a module may import only from its own package or from one listed
# before it. pipeline (the use cases) sits above every stage package; cli is the one top-level module above it.
ORDER = ("core", "pins", "engine", "sources", "lock", "image", "gating", "report", "release", "runners", "nightly",
         "bisect", "pipeline", "cli", "__main__")


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(BUILDER.rglob("*.py")):
        if IN_IMAGE in path.parents or any(d in path.parents for d in IN_CONTAINER) or \
                path.name == "__init__.py" and path.parent == BUILDER:
            continue
        rel = path.relative_to(BUILDER).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found["builder." + ".".join(parts)] = path
    return found


def package(module: str) -> str:
    return module.split(".")[1]


DYNAMIC = ("import_module", "__import__")  # importlib.import_module(...), __import__(...)
LAZY = re.compile(r"#\s*lazy:\s*\w{3,}")  # `# lazy: <reason>`; a bare `# lazy:` says nothing


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names: `from .. import pipeline` in builder.core.x is builder."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(parts + ([node.module] if node.module else []))


def dynamic_name(node: ast.AST) -> ast.expr | None:
    """The argument of `importlib.import_module(x)` / `import_module(x)` / `__import__(x)`, else None."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in DYNAMIC:
            return node.args[0]
    return None


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module a source imports, at top level or inside functions, relative and dynamic imports included
    (a dynamic import whose name is not a literal is reported as `<dynamic>`)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, is_package, node)
            if base:
                found.add(base)
            found |= {f"{base}.{a.name}" if base else a.name for a in node.names}
        elif (arg := dynamic_name(node)) is not None:
            found.add(arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "<dynamic>")
    return found


def imports(path: Path) -> set[str]:
    rel = path.relative_to(ROOT).with_suffix("")
    is_package = rel.name == "__init__"
    module = ".".join(rel.parts[:-1] if is_package else rel.parts)
    return imports_in(path.read_text(), module, is_package)


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: {i for i in imports(path) if i in mods and i != name} for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def climbs(edges: dict[str, set[str]]) -> list[str]:
    """Arrows that climb: a module imports a package listed after its own in ORDER."""
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(f"{src} -> {dst}" for src, dsts in edges.items() for dst in dsts
                  if rank[package(dst)] > rank[package(src)])


def hidden_imports(source: str) -> list[int]:
    """Lines of imports (statements or dynamic calls) inside functions without a `# lazy: <reason>`."""
    lines = source.splitlines()
    hidden = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)) or \
                        isinstance(inner, ast.Call) and dynamic_name(inner) is not None:
                    if not LAZY.search(lines[inner.lineno - 1]):
                        hidden.add(inner.lineno)
    return sorted(hidden)


def test_builder_import_graph_has_no_circles() -> None:
    assert cycles(graph()) == []


def test_every_module_lives_in_a_listed_package() -> None:
    assert sorted({package(m) for m in modules()} - set(ORDER)) == []
    assert sorted(p.name for p in BUILDER.glob("*.py")) == ["__init__.py", "__main__.py", "cli.py"]


def test_packages_import_only_downwards() -> None:
    """No arrow climbs: a module imports its own package or a package listed before it in ORDER."""
    assert climbs(graph()) == []


def test_imports_sit_at_module_top_unless_marked_lazy() -> None:
    """An import inside a function hides an edge; the few kept lazy (heavy libraries, start-up time) say why."""
    hidden = [f"{name}:{line}" for name, path in modules().items() for line in hidden_imports(path.read_text())]
    assert hidden == []


def test_dynamic_imports_name_a_literal_module() -> None:
    """`importlib.import_module(name)` with a computed name would hide its edge from every check above."""
    assert sorted(name for name, path in modules().items() if "<dynamic>" in imports(path)) == []


# Planted defects: each hole the checks above once had, in a module placed in builder.core (the lowest package).
PLANTED = "builder.core.planted"
CLIMBING = {
    "relative import naming no module": "from .. import pipeline\n",
    "relative import of a sibling package": "from ..release import publish\n",
    "importlib.import_module": "import importlib\nimportlib.import_module('builder.pipeline')\n",
    "bare import_module": "from importlib import import_module\nimport_module('builder.nightly.fleet')\n",
    "__import__": "__import__('builder.cli')\n",
}


@pytest.mark.parametrize("source", CLIMBING.values(), ids=CLIMBING.keys())
def test_planted_upward_import_is_caught(source: str) -> None:
    mods = set(modules()) | {PLANTED}
    edges = {PLANTED: {i for i in imports_in(source, PLANTED) if i in mods and i != PLANTED}}
    assert climbs(edges), f"not caught: {source!r}"
    assert climbs({PLANTED: {i for i in imports_in("from . import errors\n", PLANTED) if i in mods}}) == []


def test_planted_cycle_through_a_relative_import_is_caught() -> None:
    edges = {"builder.core.a": imports_in("from .b import x\n", "builder.core.a") & {"builder.core.b"},
             "builder.core.b": imports_in("from . import a\n", "builder.core.b") & {"builder.core.a"}}
    assert cycles(edges) == [["builder.core.a", "builder.core.b", "builder.core.a"]]


def test_planted_computed_dynamic_import_is_caught() -> None:
    assert "<dynamic>" in imports_in("import importlib\nname = 'builder.cli'\nimportlib.import_module(name)\n", PLANTED)
    assert "<dynamic>" not in imports_in("import importlib\nimportlib.import_module('json')\n", PLANTED)


HIDDEN = {
    "no comment": "def f() -> None:\n    import yaml\n",
    "lazy with no reason": "def f() -> None:\n    import yaml  # lazy:\n",
    "lazy with a blank reason": "def f() -> None:\n    import yaml  # lazy:   \n",
    "import_module in a function": "import importlib\n\n\ndef f() -> None:\n    importlib.import_module('yaml')\n",
}


@pytest.mark.parametrize("source", HIDDEN.values(), ids=HIDDEN.keys())
def test_planted_hidden_import_is_caught(source: str) -> None:
    assert hidden_imports(source), f"not caught: {source!r}"


def test_lazy_import_with_a_reason_passes() -> None:
    assert hidden_imports("def f() -> None:\n    import yaml  # lazy: start-up\n") == []
    assert hidden_imports("import yaml\n") == []


def test_no_production_module_imports_demo_code() -> None:
    offenders = {name: sorted(i for i in imports(path) if i == "demo" or i.startswith("demo."))
                 for name, path in modules().items()}
    assert {k: v for k, v in offenders.items() if v} == {}


SDK_USE = re.compile(r"\b(?:client|self\.client)\.(?:api|containers|images|info|version|ping)\b")


def sdk_offenders(files: dict[str, str]) -> list[str]:
    """Where a module outside builder/engine imports the Docker SDK or reaches into an SDK client
    (`files`: module name -> source)."""
    found = []
    for name, source in files.items():
        if name.startswith("builder.engine."):
            continue
        if any(i == "docker" or i.startswith("docker.") for i in imports_in(source, name)):
            found.append(f"{name}: imports the Docker SDK")
        found += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(source.splitlines(), 1)
                  if SDK_USE.search(line)]
    return found


def test_only_the_engine_package_talks_to_the_docker_sdk() -> None:
    """One door to the engine: containers, images, save/load and inspect go through builder/engine."""
    assert sdk_offenders({name: path.read_text() for name, path in modules().items()}) == []


def test_the_engine_door_check_catches_a_planted_sdk_use() -> None:
    planted = {"builder.gating.x": "def f():\n    import docker  # lazy: x\n",
               "builder.release.y": "def g(client):\n    return client.images.get('x')\n",
               "builder.engine.z": "import docker\n"}
    found = sdk_offenders(planted)
    assert found[0] == "builder.gating.x: imports the Docker SDK" and "client.images.get" in found[1]
    assert len(found) == 2


RELEASE_NAMES = re.compile(r"\bReport\b|^def (accepted_ref|release_manifest|move_tags|promote|rollback)\b")


def release_offenders(sources: dict[str, str]) -> list[str]:
    """Where a module of builder/engine reads a report or moves a release tag: which digest may be released, and its
    tags, are builder/release/promote.py's; the engine side only pushes to staging and pulls (a publish that asked the
    engine side and came back went between the two rooms twice for one decision)."""
    return [f"{name}:{n}: {line.strip()}" for name, source in sources.items() if name.startswith("builder.engine.")
            for n, line in enumerate(source.splitlines(), 1) if RELEASE_NAMES.search(line)]


def test_the_engine_side_reads_no_report_and_moves_no_release_tag() -> None:
    assert release_offenders({name: path.read_text() for name, path in modules().items()}) == []


def test_the_release_check_catches_a_planted_report_reader() -> None:
    planted = {"builder.engine.staging": "from builder.core.records import Pulled, Report\n"
                                         "def move_tags(reg, repository, manifest, tags): ...\n",
               "builder.release.promote": "def accepted_ref(report: Report) -> None: ...\n"}
    assert [line.split(": ", 1)[0] for line in release_offenders(planted)] == ["builder.engine.staging:1",
                                                                                 "builder.engine.staging:2"]


# modules that may open an HTTP session: the registry's one door, the lock's index downloads, the nightly webhook
HTTP_DOORS = ("builder.engine.registry.transport", "builder.lock.download", "builder.nightly.notify")
HTTP_OPEN = re.compile(r"requests\.(Session|get|post|put|head|delete|patch|request)\(")


def http_offenders(sources: dict[str, str]) -> list[str]:
    return [f"{name}:{n}: {line.strip()}" for name, source in sources.items() if name not in HTTP_DOORS
            for n, line in enumerate(source.splitlines(), 1) if HTTP_OPEN.search(line)]


def test_only_the_registry_door_opens_registry_sessions() -> None:
    """One door to registries: no module but builder/engine/registry/transport.py opens a session to one."""
    assert http_offenders({name: path.read_text() for name, path in modules().items()}) == []


def test_the_registry_door_check_catches_a_planted_session() -> None:
    planted = {"builder.engine.infra": "s = requests.Session()\n", "builder.engine.registry.transport": "requests.get(u)\n"}
    assert http_offenders(planted) == ["builder.engine.infra:1: s = requests.Session()"]


def test_only_options_reads_the_environment() -> None:
    readers = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                readers.append(name)
    assert set(readers) <= {"builder.core.options", "builder.core.commands"}, readers  # commands pass env to apt-get only
    commands = (BUILDER / "core" / "commands.py").read_text()
    assert "os.environ.get" not in commands and "os.getenv" not in commands


def test_package_data_only_through_resources() -> None:
    offenders = [name for name, path in modules().items()
                 if "__file__" in path.read_text() and name not in ("builder.core.options", "builder.core.resources")]
    assert offenders == []


SHARED = ("COMPONENTS", "GATES", "CACHE_ENV", "CACHE_ENV_VARS", "SOURCE_DATE_EPOCH", "BUILDER_VERSION", "METRICS",
          "MANIFEST", "DEFAULT_METRICS", "TIMEOUT_S", "BUILD_TIMEOUT_S")


def test_each_shared_constant_is_defined_once() -> None:
    where: dict[str, list[str]] = {}
    files = list(modules().values()) + list((ROOT / "acceptance").glob("*.py"))
    for path in files:
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id in SHARED:
                    where.setdefault(target.id, []).append(path.relative_to(ROOT).as_posix())
    assert {k: v for k, v in where.items() if len(v) > 1} == {}


def test_design_md_record_tables_match_the_records() -> None:
    text = (ROOT / "DESIGN.md").read_text()
    match = re.search(r"<!-- records:begin -->\n(.*?)<!-- records:end -->", text, re.S)
    assert match, "DESIGN.md lacks the generated records section"
    assert match.group(1).strip() == records.design_tables().strip(), \
        "DESIGN.md is stale: regenerate with `make docs`"


def test_design_md_names_only_functions_that_exist() -> None:
    """Every `module.function(` DESIGN.md names in its stage table exists with that name."""
    import importlib

    text = (ROOT / "DESIGN.md").read_text()
    stems = {name.split(".")[-1]: name for name in modules()}
    named = {(m, f) for m, f in re.findall(r"\b(\w+)\.(\w+)\(", text) if m in stems}
    assert len(named) >= 7
    missing = []
    for module, func in sorted(named):
        try:
            mod = importlib.import_module(stems[module])
        except ModuleNotFoundError:
            missing.append(f"{module}.{func}")
            continue
        if not callable(getattr(mod, func, None)):
            missing.append(f"{module}.{func}")
    assert missing == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_stage_functions_are_fully_annotated(name: str) -> None:
    """Every public function of builder/ has annotations for all parameters and its return (mypy checks them)."""
    bad = []
    for node in ast.walk(ast.parse(modules()[name].read_text())):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
            args = node.args.args + node.args.kwonlyargs
            if node.returns is None or any(a.annotation is None for a in args if a.arg not in ("self", "cls")):
                bad.append(node.name)
    assert bad == []
