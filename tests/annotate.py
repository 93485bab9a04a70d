"""Add the obvious annotations to test files (a mechanical pass; mypy --strict finds the rest).

    python tests/annotate.py tests/unit/test_x.py ...     (no arguments: every tests/**/test_*.py and conftest.py)

- `test_*` functions with no return annotation and no `return <value>`/`yield` get `-> None`;
- a parameter named in TYPES with no annotation gets that type (fixtures and common helper names), one that
  names a fixture of the same file with a return annotation gets that type, and one that a
  `@pytest.mark.parametrize` fills from a list of plain literals gets their type (`str`, `int | None`, ...);
- the imports those types need are added after the module docstring / `from __future__` line.
Idempotent: run it again on newly merged tests, then `ruff check --fix` (import order) and mypy.

    mypy > out.txt; python tests/annotate.py --type-args out.txt

fills the bare `dict`/`list`/`tuple` mypy reports ([type-arg]) with `dict[str, Any]`, `list[Any]`, `tuple[Any, ...]`.
"""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

TESTS = Path(__file__).resolve().parent
LIMIT = 130  # ruff's line-length

# parameter name -> (annotation, the import it needs or "")
TYPES: dict[str, tuple[str, str]] = {
    "tmp_path": ("Path", "from pathlib import Path"),
    "tmp_path_factory": ("pytest.TempPathFactory", "import pytest"),
    "monkeypatch": ("pytest.MonkeyPatch", "import pytest"),
    "capsys": ("pytest.CaptureFixture[str]", "import pytest"),
    "capfd": ("pytest.CaptureFixture[str]", "import pytest"),
    "caplog": ("pytest.LogCaptureFixture", "import pytest"),
    "request": ("pytest.FixtureRequest", "import pytest"),
    "settings": ("Settings", "from builder.core.options import Settings"),
    "docker_client": ("DockerClient", "from tests.fixture_types import DockerClient"),
    "infra_setup": ("Info", "from builder.engine.infra import Info"),
    "base_image": ("str", ""),
    "demo_pins": ("Path", "from pathlib import Path"),
    "stamped_pins": ("Path", "from pathlib import Path"),
    "demo_image": ("DemoImage", "from tests.fixture_types import DemoImage"),
    "demo_accepted": ("DemoAccepted", "from tests.fixture_types import DemoAccepted"),
    "build_variant": ("BuildVariant", "from tests.fixture_types import BuildVariant"),
    "report_inputs": ("MakeReportInputs", "from tests.fixture_types import MakeReportInputs"),
    "second_engine": ("Engine", "from tests.engines import Engine"),
    "staged_demo": ("str", ""),
    "run_id": ("str", ""),
}


def header_colon(tokens: list[tokenize.TokenInfo], line: int) -> tuple[int, int]:
    """(row, col) of the `:` that ends the `def` header starting on `line`."""
    depth, seen_def = 0, False
    for tok in tokens:
        if tok.start[0] < line:
            continue
        if tok.type == tokenize.NAME and tok.string == "def":
            seen_def = True
        elif seen_def and tok.type == tokenize.OP:
            if tok.string in "([{":
                depth += 1
            elif tok.string in ")]}":
                depth -= 1
            elif tok.string == ":" and depth == 0:
                return tok.start
    raise ValueError(f"no header colon after line {line}")


def wrap(line: str, limit: int = LIMIT) -> str:
    """A header line over the limit, cut after its last top-level `, ` that fits, continued under the `(`."""
    body = line.rstrip("\n")
    if len(body) <= limit:
        return line
    stripped = body.lstrip()
    is_def = stripped.startswith(("def ", "async def "))
    align = body.index("(") + 1 if is_def else len(body) - len(stripped)
    depth, cut = 0, -1
    for i, ch in enumerate(body):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and body[i + 1:i + 2] == " " and depth == (1 if is_def else 0) and i < limit:
            cut = i
    if cut < 0 or cut + 2 <= align:
        return line
    rest = " " * align + body[cut + 2:]
    return body[:cut + 1] + "\n" + wrap(rest + "\n", limit)


def returns_value(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    def walk(node: ast.AST) -> bool:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, (ast.Yield, ast.YieldFrom)) or isinstance(child, ast.Return) and child.value is not None:
                return True
            if walk(child):
                return True
        return False
    return walk(func)


def local_fixtures(source: str, tree: ast.Module) -> dict[str, tuple[str, str]]:
    """The file's own annotated fixtures: name -> (the value's type, no import: the file has it)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.returns is not None and \
                any("fixture" in ast.unparse(d) for d in node.decorator_list):
            kind = ast.get_source_segment(source, node.returns) or ""
            match = re.fullmatch(r"(?:Iterator|Generator|Iterable)\[(.*?)(?:, None, None)?\]", kind)
            found[node.name] = (match.group(1) if match else kind, "")
    return found


def literal_type(node: ast.expr) -> str | None:
    """The type of a literal in a parametrize list (`"a"` -> str, `[1]` -> list[int]); None if not a plain literal."""
    if isinstance(node, ast.Constant):
        return "None" if node.value is None else type(node.value).__name__
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return type(node.operand.value).__name__
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        inner = {literal_type(e) for e in node.elts}
        if None in inner:
            return None
        outer = {ast.List: "list", ast.Tuple: "tuple", ast.Set: "set"}[type(node)]
        args = " | ".join(sorted(t for t in inner if t)) or "Any"
        return f"{outer}[{args}, ...]" if outer == "tuple" else f"{outer}[{args}]"
    if isinstance(node, ast.Dict):
        return "dict[str, Any]"
    if isinstance(node, ast.BinOp):  # "a" * 40, "x" + "y", 2 ** 31
        sides = {literal_type(node.left), literal_type(node.right)}
        for kind in ("str", "bytes", "float", "int"):
            if kind in sides and None not in sides:
                return kind
    return None


def parametrized(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, str]:
    """name -> type for the arguments of `@pytest.mark.parametrize(names, [literal rows])`."""
    found: dict[str, str] = {}
    for deco in func.decorator_list:
        if not (isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("parametrize") and len(deco.args) >= 2):
            continue
        names_node, rows_node = deco.args[0], deco.args[1]
        if isinstance(names_node, ast.Constant) and isinstance(names_node.value, str):
            names = [n.strip() for n in names_node.value.split(",") if n.strip()]
        elif isinstance(names_node, (ast.List, ast.Tuple)):
            names = [e.value for e in names_node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        else:
            continue
        if not isinstance(rows_node, (ast.List, ast.Tuple)):
            continue
        kinds: list[set[str | None]] = [set() for _ in names]
        for row in rows_node.elts:
            if isinstance(row, ast.Call) and ast.unparse(row.func).endswith("param"):
                values = list(row.args)
            elif len(names) > 1 and isinstance(row, (ast.Tuple, ast.List)):
                values = list(row.elts)
            else:
                values = [row]
            if len(values) != len(names):
                kinds = [{None} for _ in names]
                break
            for i, value in enumerate(values):
                kinds[i].add(literal_type(value))
        for name, kind in zip(names, kinds):
            if kind and None not in kind:
                parts = sorted(k for k in kind if k and k != "None") + (["None"] if "None" in kind else [])
                found[name] = " | ".join(parts)
    return found


def annotate(source: str) -> str:
    tree = ast.parse(source)
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    edits: list[tuple[int, int, str]] = []  # (row, col, text to insert)
    needed: set[str] = set()
    types = {**TYPES, **local_fixtures(source, tree)}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        params = {name: (kind, "") for name, kind in parametrized(node).items()}
        for arg in args:
            if arg.annotation is None and (arg.arg in params or arg.arg in types):
                kind, imp = params.get(arg.arg) or types[arg.arg]
                if "Any" in kind:
                    needed.add("from typing import Any")
                edits.append((arg.lineno, arg.end_col_offset or 0, f": {kind}"))
                if imp:
                    needed.add(imp)
        if node.returns is None and node.name.startswith("test_") and not returns_value(node):
            row, col = header_colon(tokens, node.lineno)
            edits.append((row, col, " -> None"))
    if not edits:
        return source
    lines = source.splitlines(keepends=True)
    for row, col, text in sorted(edits, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + text + line[col:]
    for row in sorted({r for r, _, _ in edits}, reverse=True):
        lines[row - 1] = wrap(lines[row - 1])
    bound = {a.asname or a.name for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    missing = sorted(imp for imp in needed if imp.split()[-1] not in bound)
    if missing:
        at = 0  # after the docstring and `from __future__` imports
        for n in tree.body:
            is_doc = isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
            if is_doc or isinstance(n, ast.ImportFrom) and n.module == "__future__":
                at = n.end_lineno or at
            else:
                break
        lines[at:at] = [m + "\n" for m in missing]
    return "".join(lines)


BARE = re.compile(r'Missing type arguments for generic type "(dict|list|tuple|set|frozenset|type)"')
FILL = {"dict": "dict[str, Any]", "list": "list[Any]", "tuple": "tuple[Any, ...]", "set": "set[Any]",
        "frozenset": "frozenset[Any]", "type": "type[Any]"}


def type_args(mypy_output: Path) -> None:
    """Fill the bare generics mypy --strict reports ([type-arg]) with Any: `dict` -> `dict[str, Any]` (JSON objects)."""
    todo: dict[Path, set[tuple[int, str]]] = {}
    for line in mypy_output.read_text().splitlines():
        match = BARE.search(line)
        if match and line.count(":") >= 2:
            where, row = line.split(":")[:2]
            todo.setdefault(Path(where), set()).add((int(row), match.group(1)))
    for file, rows in todo.items():
        lines = file.read_text().splitlines(keepends=True)
        for number, name in rows:  # only in annotation positions: after `:`, `->`, `[`, `,` or `|`, not before `(` or `[`
            lines[number - 1] = re.sub(rf"((?::|->|\[|,|\|)\s*){name}\b(?![\[(.])", rf"\g<1>{FILL[name]}", lines[number - 1])
        text = "".join(lines)
        if not re.search(r"^from typing import .*\bAny\b|^import typing", text, re.M):
            tree = ast.parse(text)
            at = 0
            for n in tree.body:
                is_doc = isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                if is_doc or isinstance(n, ast.ImportFrom) and n.module == "__future__":
                    at = n.end_lineno or at
                else:
                    break
            lines = text.splitlines(keepends=True)
            lines[at:at] = ["from typing import Any\n"]
            text = "".join(lines)
        file.write_text(text)
        print(f"type args {file}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--type-args"]:  # python tests/annotate.py --type-args mypy-output.txt
        type_args(Path(argv[1]))
        return 0
    paths = [Path(a) for a in argv] or sorted(p for p in TESTS.rglob("*.py") if p.name.startswith("test_")
                                              or p.name == "conftest.py")
    for path in paths:
        text = path.read_text()
        new = annotate(text)
        if new != text:
            path.write_text(new)
            print(f"annotated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
