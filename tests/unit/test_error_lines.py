"""Error lines stay within 300 characters over long paths: the longest paths are elided (head and file name
kept) in every BuilderError and again where the CLI prints; trust, sources.resolve and the lock reader."""
import hashlib
import shutil
from pathlib import Path

import pytest

from builder import cli
from builder.core.errors import BadInput, BuilderError, BuildFailed, InfraError
from builder.core.safetext import MAX_LINE, elide, fit
from builder.lock import record as lock_record
from builder.release import trust
from tests.fixture_types import MakeReportInputs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def deep(tmp_path: Path) -> Path:
    """A folder about 1,000 characters deep."""
    path = tmp_path.joinpath(*["d" * 120] * 8)
    path.mkdir(parents=True)
    return path


def test_fit_leaves_a_short_line_alone() -> None:
    line = "error: /tmp/x/pins.yaml: base.python: expected 3.11"
    assert fit(line) == line


def test_fit_elides_the_longest_paths_and_keeps_the_file_names(deep: Path) -> None:
    pins, url = f"{deep}/pins.yaml", f"{deep}/demo-stack/tinyengine.git"
    line = fit(f"error: {pins}: components.vllm.url: {url} is not in the mirror cache; run without --offline once")
    assert len(line) <= MAX_LINE, line
    assert "/pins.yaml: components.vllm.url: " in line and "/demo-stack/tinyengine.git is not in the mirror" in line
    assert line.endswith("run without --offline once") and line.startswith(f"error: {str(deep)[:15]}")


def test_fit_cuts_what_has_no_path_and_elide_keeps_the_tail() -> None:
    assert len(fit("x" * 5000)) == MAX_LINE
    short = "/tmp/pytest-of-runner/pytest-0/test_case_reference_repository0/case/p.yaml"  # named in full
    assert fit(f"{short}: {'y' * 400}").startswith(f"{short}: yyy") and len(fit(f"{short}: {'y' * 400}")) == MAX_LINE
    assert elide("/a/" + "b" * 200 + "/file.json", 60).endswith("/file.json")
    assert len(elide("/a/" + "b" * 200 + "/file.json", 60)) <= 60


def test_fit_elides_shorter_paths_after_the_leading_one_before_cutting() -> None:
    report = "/tmp/pytest-of-root/pytest-127/test_refuses_report_for_anothe0/report.json"
    ref = "127.0.0.1:5000/tests/other-image:vllm-87185e8f7f83.megatron-341823c62b4f.verl-326d9d4a55ad"
    one, two = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    line = fit(f"error: {report}: local image {ref} is {one}, the report accepted {two}")
    assert len(line) <= MAX_LINE and line.startswith(f"error: {report}: local image 127.0.0.1:5")
    assert line.endswith(f"verl-326d9d4a55ad is {one}, the report accepted {two}"), line


def test_every_builder_error_is_one_bounded_line(deep: Path) -> None:
    err = BadInput(f"{deep}/report.json:\nacceptance: {deep}/evidence.json is missing")
    assert len(str(err)) <= MAX_LINE and "\n" not in str(err) and "/report.json: acceptance: " in str(err)


def test_the_cli_bounds_the_line_whatever_the_producer(deep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = BuilderError("short")
    err.args = (f"{deep}/x.json: " + "y" * 2000,)  # a producer that bypassed the constructor
    assert cli._report(err) == 1
    line = capsys.readouterr().err.splitlines()[0]
    assert line.startswith("error: ") and len(line) <= MAX_LINE and "/x.json: yyy" in line


def test_trust_refusal_over_a_long_report_path(deep: Path, report_inputs: MakeReportInputs) -> None:
    from builder.report import document as report_mod

    pins, sources, built, result = report_inputs(statuses={"rl_step": "fail"})
    report = report_mod.make_report(pins, lock_record.of(pins), sources, built, result)
    report = report.model_copy(update={"verdict": "ACCEPTED"})
    with pytest.raises(BadInput) as info:
        trust.check(report, f"{deep}/report.json")
    message = str(info.value)
    assert len(message) <= MAX_LINE and "/report.json: " in message and message.endswith("refusing to publish")


def test_resolve_error_over_a_long_pins_path(deep: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (deep / "locks").mkdir()
    shutil.copy(ROOT / "pins" / "demo.yaml", deep / "p.yaml")
    shutil.copy(ROOT / "pins" / "locks" / "demo.lock", deep / "locks" / "demo.lock")
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    assert cli.run(["resolve", str(deep / "p.yaml"), "--offline"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and len(lines[0]) <= MAX_LINE, lines
    assert "/p.yaml: components.vllm.url: " in lines[0] and "/demo-stack/tinyengine.git is " in lines[0], lines[0]


@pytest.mark.parametrize("text,fragment", [
    ("x" * 3000 + "=1.0\n", "expected name==version, got 'xxx"),
    ("torch==" + "1" * 3000 + "\n", "has no --hash=sha256:"),
    ("torch==1.0 --hash=sha256:" + "z" * 3000 + "\n", "expected --hash=sha256:<64 hex>"),
])
def test_lock_errors_over_a_long_path_and_long_tokens(deep: Path, text: str, fragment: str) -> None:
    lock = deep / "demo.lock"
    lock.write_text(f"ok==1.0 --hash=sha256:{hashlib.sha256(b'').hexdigest()}\n" + text)
    with pytest.raises(BadInput) as info:
        lock_record.load(lock)
    message = str(info.value)
    assert len(message) <= MAX_LINE and "/demo.lock:2: " in message and fragment in message, message


def test_a_log_path_is_never_elided(deep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28, item 13: a failed build's log path is the one thing a person pastes; it stays whole, on its
    own line when the error line has no room for it."""
    short = "/root/.cache/rl-image-builder/contexts/6dae48c1/build-20260101-000000-123456789.log"
    line = fit(f"error: docker build x: failed at step 5/9; log {short}: the step exited 1 {'y' * 150}")
    assert short in line and len(line) <= MAX_LINE
    logfile = f"{deep}/build-20260101-000000-123456789.log"
    err = BuildFailed(f"docker build 127.0.0.1:5000/demo/unified:tag: failed at step 5/9 `RUN x`; log {logfile}:"
                      " the step exited 1", details=["tail line"])
    assert logfile not in str(err) and err.logs == [logfile] and "..." not in str(err)
    assert str(err) == ("docker build 127.0.0.1:5000/demo/unified:tag: failed at step 5/9 `RUN x`; log (path below):"
                        " the step exited 1")
    assert cli._report(err) == 1
    assert capsys.readouterr().err.splitlines() == [f"error: {err}", f"log: {logfile}", "  | tail line"]


def test_a_log_path_that_fits_stays_in_the_line_and_other_paths_give_way(deep: Path) -> None:
    other = f"{deep}/context.tar"
    logfile = "/root/.cache/rl-image-builder/logs/pip-download-lock-20260101-000000.log"
    err = InfraError(f"pip download into {other}: exit 1; log {logfile}")
    assert err.logs == [] and str(err).endswith(f"; log {logfile}") and len(str(err)) <= MAX_LINE - 7
