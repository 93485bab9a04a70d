"""A refusal of bad input is exactly one line on stderr (the `error:` line, no step lines around it), exit 2,
for every command that reads the input: a sample of tests/hostile_corpus.py through each of them."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile_corpus import Case, all_cases, run_in_process

CASES = all_cases()
PINS_KLASSES = ("parser", "reference", "pip", "env", "unicode", "files", "bounds")
SAMPLE = [next(c for c in CASES if c.klass == k and not c.accept) for k in PINS_KLASSES] + \
    [c for c in CASES if c.name in ("alias-bomb-9x9", "NEL-in-quoted-value")]
REPORTS = [c for c in CASES if c.klass == "report" and not c.accept][:4]
PINS_COMMANDS = (["pins"], ["resolve", "--offline"], ["render"], ["render", "--pins-only"], ["build", "--offline"],
                 ["accept", "--offline"], ["run", "--offline"], ["lock", "--offline"], ["lock", "--check", "--offline"],
                 ["nightly"])
REPORT_COMMANDS = (["publish"], ["export-sqsh"])


def _one_line(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []
    out = run_in_process(argv, calls)
    assert not out.crashed, out.crashed
    assert calls == [], calls
    assert out.code == 2, (argv, out.code, out.stderr[-400:])
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, lines)


@pytest.mark.parametrize("command", PINS_COMMANDS, ids=["-".join(c) for c in PINS_COMMANDS])
@pytest.mark.parametrize("case", SAMPLE, ids=[c.id for c in SAMPLE])
def test_pins_refusal_is_one_line(case: Case, command: list[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "case"
    folder.mkdir()
    pins = case.setup(folder)[-1]
    _one_line([*command, pins], tmp_path, monkeypatch)


@pytest.mark.parametrize("command", REPORT_COMMANDS, ids=["-".join(c) for c in REPORT_COMMANDS])
@pytest.mark.parametrize("case", REPORTS, ids=[c.id for c in REPORTS])
def test_report_refusal_is_one_line(case: Case, command: list[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "case"
    folder.mkdir()
    argv = case.setup(folder)
    assert argv[0] == "publish"
    _one_line([*command, argv[1]], tmp_path, monkeypatch)


def test_no_library_module_has_a_main() -> None:
    """The CLI is the one entry (exit codes from core/errors.py); the only other mains write generated docs
    (options, records) or run inside a container or the image (scripts/)."""
    root = Path(__file__).resolve().parents[2] / "builder"
    allowed = {"cli.py", "__main__.py", "core/options.py", "core/records.py"}
    mains = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if "__name__ == \"__main__\"" in p.read_text() and "scripts" not in p.parts)
    assert sorted(set(mains) - allowed) == [], mains
    assert "-m builder setup" in (root.parent / "Makefile").read_text()
