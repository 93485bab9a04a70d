"""The docs match the code: a short README that links every page, the settings page generated from
builder/core/options.py, DESIGN.md's module map naming every module once, relative links that resolve, and every
code path the docs name (tests/..., builder/..., acceptance/...) there."""
import ast
import importlib.util
import re
from pathlib import Path

import typer

from builder import cli
from builder.core import options
from tests.unit.test_architecture import ORDER

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "DESIGN.md", ROOT / "benchmarks" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# a repository path of code the docs name: tests/unit/test_x.py, builder/core/log.py, tests/integration/test_cluster_*.py
CODE_PATH = re.compile(r"(?<![\w/.-])(?:tests|builder|acceptance)/[\w/*.-]*?\.py\b")


def test_readme_is_a_landing_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 120
    assert [n for n, line in enumerate(lines, 1) if len(line) > 120] == []


def test_every_doc_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target.split("#")[0]).resolve() for target in LINK.findall(README.read_text())}
    assert [p.relative_to(ROOT).as_posix() for p in PAGES if p.resolve() not in linked] == []


def test_relative_links_resolve() -> None:
    broken = []
    for page in [README, *PAGES]:
        for target in LINK.findall(page.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_readme_has_one_line_per_command() -> None:
    group = typer.main.get_command(cli.app)
    assert isinstance(group, typer.core.TyperGroup)
    commands = set(group.commands)
    listed = re.findall(r"^\| `builder ([a-z-]+)[ `]", README.read_text(), re.M)
    assert sorted(listed) == sorted(commands)


def test_settings_page_is_generated_from_options() -> None:
    assert (ROOT / "docs" / "settings.md").read_text() == options.markdown(), \
        "docs/settings.md is stale: regenerate with `make docs`"


def _variables_read() -> set[str]:
    """Names options.py reads from its `env` mapping: env.get("X"), env["X"], helper(env, "X", ...)."""
    found = set()
    for node in ast.walk(ast.parse(Path(options.__file__).read_text())):
        if isinstance(node, ast.Call):
            args = node.args
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "env":
                args = [node.func.value, *args]
            if len(args) >= 2 and isinstance(args[0], ast.Name) and args[0].id == "env" and \
                    isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
                found.add(args[1].value)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "env" and \
                isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            found.add(node.slice.value)
    return found


def test_every_variable_read_is_listed_and_every_listed_one_is_read() -> None:
    read = _variables_read()
    assert len(read) >= 10
    assert read == {v.name for v in options.VARIABLES}


def _package(path: str) -> str:
    parts = Path(path).relative_to("builder").parts
    if len(parts) > 1:
        return parts[0]
    return "pipeline" if parts[0] == "pipeline.py" else "cli"


def test_design_module_map_names_every_module_once_in_package_order() -> None:
    text = (ROOT / "DESIGN.md").read_text()
    match = re.search(r"<!-- modules:begin -->\n(.*?)<!-- modules:end -->", text, re.S)
    assert match, "DESIGN.md lacks the module map section"
    rows = re.findall(r"^\| `(builder/[^`]+\.py)` \|", match.group(1), re.M)
    on_disk = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "builder").rglob("*.py")
                     if not (p.name == "__init__.py" and p.parent != ROOT / "builder" and not p.read_text().strip()))
    assert sorted({r for r in rows if rows.count(r) > 1}) == []
    assert sorted(set(on_disk) - set(rows)) == [], "modules missing from DESIGN.md's map"
    assert sorted(set(rows) - set(on_disk)) == [], "DESIGN.md's map names modules that do not exist"
    ranks = [ORDER.index(_package(r)) for r in rows]
    assert ranks == sorted(ranks), "DESIGN.md's map is not grouped in tests/unit/test_architecture.py's ORDER"


def test_every_benchmark_script_is_listed_and_imports() -> None:
    """benchmarks/README.md names every script, and each still imports (they run rarely, so a stale import
    would otherwise go unnoticed)."""
    listed = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert [p.name for p in scripts if p.name not in listed] == []
    for path in scripts:
        spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
        assert spec and spec.loader
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _schema_fields(node: object) -> set[str]:
    """Every property name anywhere in the pins JSON Schema."""
    if isinstance(node, dict):
        names = set(node.get("properties") or {})
        return names.union(*(_schema_fields(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_schema_fields(v) for v in node))
    return set()


def test_the_pins_page_covers_every_field_of_the_schema() -> None:
    """docs/pins.md ("every field") names each pins field as a YAML key or in backticks (issue 28, item 15)."""
    import json

    schema = json.loads((ROOT / "builder" / "pins" / "schema" / "pins.schema.json").read_text())
    page = (ROOT / "docs" / "pins.md").read_text()
    fields = _schema_fields(schema)
    assert {"native", "base_torch", "direct_urls", "cuda_arch", "device_var", "performance"} <= fields
    missing = [f for f in sorted(fields) if not re.search(rf"(^|[\s{{,])({re.escape(f)}):|`{re.escape(f)}`", page, re.M)]
    assert missing == []


def test_the_benchmark_readme_gives_each_script_its_required_options() -> None:
    """A script's required options (its `usage:` line, outside [...]) appear in its row of benchmarks/README.md."""
    rows = (ROOT / "benchmarks" / "README.md").read_text().splitlines()
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        usage = re.search(r"^usage: (.*)$", path.read_text(), re.M)
        if not usage:
            continue
        required = re.findall(r"(?<![\[\w-])(--[a-z][a-z0-9-]*)", re.sub(r"\[[^\]]*\]", "", usage[1]))
        named = [r for r in rows if path.name in r]
        assert named and [(r, f) for r in named for f in required if f not in r] == [], path.name


def test_every_code_path_the_docs_name_exists() -> None:
    """A test or module path in README, DESIGN, docs/, demo/ and benchmarks/ READMEs is a file (a glob: one match)."""
    missing = []
    for page in [README, *PAGES, ROOT / "demo" / "README.md"]:
        for path in sorted(set(CODE_PATH.findall(page.read_text()))):
            found = any(ROOT.glob(path)) if "*" in path else (ROOT / path).is_file()
            if not found:
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert missing == []


def test_the_code_path_pattern_finds_what_the_docs_write() -> None:
    text = ("`tests/unit/test_x.py`, (tests/integration/test_cluster_*.py) and builder/core/log.py; "
            "not demo/src/tinyrl/tests/y.py nor tests/unit/")
    assert CODE_PATH.findall(text) == ["tests/unit/test_x.py", "tests/integration/test_cluster_*.py",
                                       "builder/core/log.py"]


# hand splits of an image reference or a `sha256:` digest (DESIGN: builder/core/imageref.py is the only place)
HAND_SPLIT = re.compile(r"""removeprefix\(["']sha256:["']\)|\[len\(["']sha256:["']\):\]"""
                        r"""|(?<!netloc)\.(?:r?partition|r?split)\(["']@["']"""  # a URL's user@host is not a reference
                        r"""|\.repository\.(?:r?partition|r?split)\(["']/["']|tag\.(?:r?partition|r?split)\(["']:["']""")


def test_only_imageref_splits_references_and_digests() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "builder").rglob("*.py"))
             if path != ROOT / "builder" / "core" / "imageref.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if HAND_SPLIT.search(line)]
    assert found == [], "route these through builder/core/imageref.py (ImageRef, split_digest, hex_of)"
    assert HAND_SPLIT.search('name = digest.removeprefix("sha256:")') and HAND_SPLIT.search("repo, _, tag = tag.rpartition(':')")
    assert HAND_SPLIT.search('run = tag.split(":", 1)[0]') and not HAND_SPLIT.search("user, _, host = netloc.rpartition('@')")


def test_no_library_module_has_a_main() -> None:
    """DESIGN: the CLI is the one entry (the scripts run inside containers are not library modules)."""
    mains = [path.relative_to(ROOT).as_posix() for path in sorted((ROOT / "builder").rglob("*.py"))
             if "scripts" not in path.parts and path.name not in ("__main__.py", "cli.py")
             and re.search(r"^if __name__ == .__main__.:", path.read_text(), re.M)]
    assert mains == [], "move the main into the CLI, or into tests/gendocs.py for generated docs"
