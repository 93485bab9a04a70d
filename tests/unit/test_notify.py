"""Notifications against a local HTTP server on 127.0.0.1: the webhook fires exactly when the verdict flips (the
demo nights of tests/history_nights.py, through the call `builder nightly` makes after its row), with a
Slack-compatible payload; a webhook or command that fails or times out is one log line and changes nothing."""
from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.lock import record as lock_record
from builder.nightly import notify
from builder.nightly.history import History, Run
from builder.pipeline import nightly_runs
from builder.report import document
from tests.fixture_types import MakeReportInputs
from tests.history_nights import Hook, demo_plans, webhook, write_nights

GOOD, SLOW, DEFECT, FIXED = ("a1" * 20, "b2" * 20, "c3" * 20, "d4" * 20)


@pytest.fixture
def hook() -> Iterator[Hook]:
    with webhook() as state:
        yield state


def _nights(report_inputs: MakeReportInputs, settings: Settings, tmp_path: Path, count: int = 6) -> History:
    """The first `count` demo nights, each followed by the call `builder nightly` makes after its row (page, then
    notify)."""
    pins, sources, built, result = report_inputs()
    base = document.make_report(pins, lock_record.of(pins), sources, built, result)
    history = History(tmp_path / "history" / "runs.sqlite")

    def after_row(run_dir: Path, diff: dict[str, Any]) -> None:
        regression = diff["regression"]
        nightly_runs.nightly_page(history, run_dir, settings, bool(regression["flag"]), regression["reasons"], None)

    write_nights(base, demo_plans(GOOD, SLOW, DEFECT, FIXED)[:count], tmp_path / "runs", history, after_row=after_row)
    return history


def test_the_webhook_fires_exactly_on_the_flips(report_inputs: MakeReportInputs, settings: Settings, hook: Hook,
                                               tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    local = replace(settings, cache_root=tmp_path / "cache", notify_url=hook.url)
    history = _nights(report_inputs, local, tmp_path)
    texts = [m["text"] for m in hook.received]
    assert texts == [f"nightly {history.names()[0]}: NOT ACCEPTED: verdict flipped: ACCEPTED -> NOT ACCEPTED",
                     f"nightly {history.names()[0]}: ACCEPTED: verdict flipped: NOT ACCEPTED -> ACCEPTED"]
    first, fixed = ({f["title"]: f["value"] for f in m["attachments"][0]["fields"]} for m in hook.received)
    assert first["gate"].startswith("performance: fail: aligned / control") and f"vllm #14 {SLOW[:12]}" in first["PRs"]
    assert fixed["gate"] == "zero_update: fixed" and first["digest"].startswith("sha256:")
    assert Path(fixed["page"]) == history.path.parent / "history.html" and Path(fixed["page"]).is_file()
    assert hook.received[0]["attachments"][0]["color"] == "#cf222e"
    sent = [line for line in capfd.readouterr().err.splitlines() if line.startswith("notify:")]
    assert sent == [f"notify: webhook http://127.0.0.1:{hook.url.split(':')[2].split('/')[0]}/... sent (HTTP 200)"] * 2
    assert all("secret" not in line for line in sent)


def test_a_failing_or_slow_webhook_is_one_line_and_changes_nothing(hook: Hook) -> None:
    message = {"text": "x"}
    hook.status = 500
    answered = notify.post(hook.url, message)
    assert answered == f"notify: webhook {notify.where(hook.url)} answered HTTP 500; verdict and exit code stand"
    hook.status, hook.delay_s = 200, 2.0
    started = time.monotonic()
    line = notify.post(hook.url, message, timeout=0.3)
    assert re.search(r"not sent \((ReadTimeout|no answer within 0\.3 s)\); verdict and exit code stand$", line)
    assert time.monotonic() - started < 1.5  # the read's own timeout or the whole send's, whichever fires first
    hook.delay_s, hook.trickle_s = 0.0, 0.1  # 45 bytes, 4.5 s: each read waits 0.1 s, the whole send is bounded
    started = time.monotonic()
    line = notify.post(hook.url, message, timeout=0.5)
    assert line.endswith("not sent (no answer within 0.5 s); verdict and exit code stand")
    assert time.monotonic() - started < 1.5
    hook.trickle_s = 0.0
    closed = notify.post("http://127.0.0.1:9/hook", message, timeout=2)  # the discard port: nothing listens
    assert closed == "notify: webhook http://127.0.0.1:9/... not sent (ConnectionError); verdict and exit code stand"


def test_a_failing_webhook_leaves_the_page_and_returns(report_inputs: MakeReportInputs, settings: Settings,
                                                       tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    local = replace(settings, cache_root=tmp_path / "cache", notify_url="http://127.0.0.1:9/hook")
    history = _nights(report_inputs, local, tmp_path, count=3)  # the nightly's call returns on every night
    err = capfd.readouterr().err
    assert err.count("notify: webhook http://127.0.0.1:9/... not sent") == 1  # the flip of night 3
    assert (history.path.parent / "history.html").is_file()


def test_the_command_gets_the_message_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "got.json"
    command = f"{sys.executable} -c 'import sys; open(sys.argv[1], \"w\").write(sys.stdin.read())' {out}"
    assert notify.run_command(command, {"text": "flip"}) == f"notify: command {sys.executable} ran"
    assert json.loads(out.read_text()) == {"text": "flip"}
    assert notify.run_command(f"{sys.executable} -c 'raise SystemExit(3)'", {}).endswith("exited 3; verdict and exit code stand")
    slow = notify.run_command(f"{sys.executable} -c 'import time; time.sleep(5)'", {}, timeout=0.5)
    assert slow == f"notify: command {sys.executable} timed out after 0.5 s; verdict and exit code stand"
    assert "did not start" in notify.run_command(str(tmp_path / "missing"), {})


def _run(verdict: str, regression: bool) -> Run:
    return Run(1, "p", "t", verdict, "sha256:1", None, {}, "r.json", 0, regression)


def test_events_a_flip_or_a_flag_going_up_only() -> None:
    assert notify.event(None, "NOT ACCEPTED", False) is None  # a first night flips nothing
    assert notify.event(_run("ACCEPTED", False), "ACCEPTED", False) is None
    assert notify.event(_run("ACCEPTED", False), "NOT ACCEPTED", False) == "verdict flipped: ACCEPTED -> NOT ACCEPTED"
    assert notify.event(_run("ACCEPTED", False), "ACCEPTED", True) == "regression flag up"
    assert notify.event(_run("ACCEPTED", True), "ACCEPTED", True) is None  # still up: already told


@pytest.mark.parametrize("env,field", [({"BUILDER_NOTIFY_URL": "ftp://host/x"}, "BUILDER_NOTIFY_URL"),
                                       ({"BUILDER_NOTIFY_COMMAND": "notify 'unclosed"}, "BUILDER_NOTIFY_COMMAND")])
def test_bad_notify_settings_are_one_line_naming_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(BadInput) as err:
        Settings.from_env(env)
    assert str(err.value).startswith(f"{field}: expected") and "ftp://host" not in str(err.value)
    assert Settings.from_env({"BUILDER_NOTIFY_URL": "https://hooks.example/T/B/x"}).notify_url == "https://hooks.example/T/B/x"
