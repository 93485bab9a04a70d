"""Claims of DESIGN.md that can be checked mechanically: the pipeline signatures it lists, the modules of the
acceptance suite the tool imports, and the CLI routing every command through the pipeline."""
from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from pathlib import Path

from builder.pipeline import accepting, bisecting, building, nightly_runs, releasing

ROOT = Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "DESIGN.md").read_text()
USE_CASES = {m.__name__.rpartition(".")[2]: m for m in (accepting, bisecting, building, nightly_runs, releasing)}


def _listed() -> list[tuple[str, list[str], bool]]:
    """(module.function, parameter names, '...' given) for each use case's `<module>.f(a, b, ...)` line of the
    contracts block (the modules of builder/pipeline/)."""
    block = DESIGN.split("```", 2)[1]
    out = []
    for module, name, args in re.findall(rf"^({'|'.join(USE_CASES)})\.(\w+)\(([^)]*)\)", block, re.M):
        names = [a.strip() for a in args.split(",") if a.strip()]
        out.append((f"{module}.{name}", [a for a in names if a != "..."], "..." in names))
    return out


def test_design_lists_the_pipeline_signatures_as_they_are() -> None:
    listed = _listed()
    assert len(listed) >= 15
    for name, names, more in listed:
        module, _, func = name.partition(".")
        params = list(inspect.signature(getattr(USE_CASES[module], func)).parameters.values())
        assert [p.name for p in params[:len(names)]] == names, f"DESIGN.md: {name}({', '.join(names)})"
        rest = params[len(names):]
        if not more:
            assert rest == [], f"DESIGN.md: {name} also takes {[p.name for p in rest]}: add ', ...'"
        else:
            assert rest and all(p.default is not inspect.Parameter.empty for p in rest), name


def test_design_names_every_acceptance_module_the_tool_imports() -> None:
    used = set()
    for path in (ROOT / "builder").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "acceptance":
                used |= {node.module} if "." in node.module else {f"acceptance.{a.name}" for a in node.names}
    assert used
    for module in used:
        assert f"`{module.replace('.', '/')}.py`" in DESIGN, module


def test_design_names_every_module_of_the_acceptance_suite() -> None:
    """Each file of acceptance/ has its row in DESIGN.md's table of paths outside builder/."""
    rows = set(re.findall(r"^\| `(acceptance/[\w_]+\.py)` \|", DESIGN, re.M))
    assert sorted(f"acceptance/{p.name}" for p in (ROOT / "acceptance").glob("*.py")) == sorted(rows)


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_the_cli_calls_the_pipeline_only() -> None:
    """cli.py imports the pipeline, core modules and the pins loader (to refuse bad input early); no stage."""
    tree = ast.parse((ROOT / "builder" / "cli.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {f"builder.{a.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == "builder" for a in node.names}
    modules = {m for m in imported if importlib.util.find_spec(m.rpartition(".")[0] or m) and _is_module(m)}
    stages = {m for m in modules if m.startswith("builder.") and m.split(".")[1] not in ("core", "pipeline")}
    assert stages <= {"builder.pins", "builder.pins.model", "builder.gating", "builder.gating.plan"}, stages


def test_render_does_not_call_itself_pure() -> None:
    from builder.image import render

    assert "pure" not in (render.__doc__ or "").split("not pure")[0]
