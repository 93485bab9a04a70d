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
# before it. cli and pipeline are the two top-level modules above every package.
ORDER = ("core", "pins", "engine", "sources", "lock", "image", "accept", "report", "release", "nightly",
         "pipeline", "cli", "__main__")


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


def imports(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else f"builder.{node.module}"
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: {i for i in imports(path) if i in mods and i != name} for name, path in mods.items()}


def test_builder_import_graph_has_no_circles():
    edges = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_every_module_lives_in_a_listed_package():
    assert sorted({package(m) for m in modules()} - set(ORDER)) == []
    assert sorted(p.name for p in BUILDER.glob("*.py")) == ["__init__.py", "__main__.py", "cli.py", "pipeline.py"]


def test_packages_import_only_downwards():
    """No arrow climbs: a module imports its own package or a package listed before it in ORDER."""
    rank = {name: i for i, name in enumerate(ORDER)}
    climbs = sorted(f"{src} -> {dst}" for src, dsts in graph().items() for dst in dsts
                    if rank[package(dst)] > rank[package(src)])
    assert climbs == []


def test_imports_sit_at_module_top_unless_marked_lazy():
    """An import inside a function hides an edge; the few kept lazy (heavy libraries, start-up time) say why."""
    hidden = []
    for name, path in modules().items():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)) and "lazy:" not in lines[inner.lineno - 1]:
                        hidden.append(f"{name}:{inner.lineno}")
    assert hidden == []


def test_no_production_module_imports_demo_code():
    offenders = {name: sorted(i for i in imports(path) if i == "demo" or i.startswith("demo."))
                 for name, path in modules().items()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_options_reads_the_environment():
    readers = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                readers.append(name)
    assert set(readers) <= {"builder.core.options", "builder.core.commands"}, readers  # commands pass env to apt-get only
    commands = (BUILDER / "core" / "commands.py").read_text()
    assert "os.environ.get" not in commands and "os.getenv" not in commands


def test_package_data_only_through_resources():
    offenders = [name for name, path in modules().items()
                 if "__file__" in path.read_text() and name not in ("builder.core.options", "builder.core.resources")]
    assert offenders == []


SHARED = ("COMPONENTS", "GATES", "CACHE_ENV", "CACHE_ENV_VARS", "SOURCE_DATE_EPOCH", "BUILDER_VERSION", "METRICS",
          "MANIFEST", "DEFAULT_METRICS", "TIMEOUT_S", "BUILD_TIMEOUT_S")


def test_each_shared_constant_is_defined_once():
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


def test_design_md_record_tables_match_the_records():
    text = (ROOT / "DESIGN.md").read_text()
    match = re.search(r"<!-- records:begin -->\n(.*?)<!-- records:end -->", text, re.S)
    assert match, "DESIGN.md lacks the generated records section"
    assert match.group(1).strip() == records.design_tables().strip(), \
        "DESIGN.md is stale: regenerate with `python -m builder.core.records`"


def test_design_md_names_only_functions_that_exist():
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
def test_stage_functions_are_fully_annotated(name):
    """Every public function of builder/ has annotations for all parameters and its return (mypy checks them)."""
    bad = []
    for node in ast.walk(ast.parse(modules()[name].read_text())):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
            args = node.args.args + node.args.kwonlyargs
            if node.returns is None or any(a.annotation is None for a in args if a.arg not in ("self", "cls")):
                bad.append(node.name)
    assert bad == []
