"""The nightly history page in a real browser: headless Debian Chromium loads it from file:// and the DevTools
protocol (a small websocket client) reports console errors, uncaught exceptions and every request. For 0, 1 and
60 nights: no console error, no request leaves file://, the charts and the per-night table are there, and each
failing night is red at a glance (row border, strip square) as the browser computed it. The demo nights are
derived from the session's real accepted report (conftest demo_accepted; tests/history_nights.py): classified new,
recurring and fixed, compared (the moved commit, the changed layer), the webhook fired on the two flips.

The report page (`builder report --format html`, with a cluster run's processes, census, JIT kernels, replay
bundle and node) and the compare page (`builder compare A B --format html`) load the same way: no console error,
nothing from elsewhere, a screenshot that is not blank (saved under .cache/screenshots/, ignored by git), and
their key cells read back from the rendered DOM.

One Chromium per module (about a second to start). Without Chromium the tests skip, except under CI, where they
fail (.ci/run installs Debian's `chromium`)."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import websocket
from PIL import Image

from builder.core.options import Settings
from builder.core.records import Report
from builder.engine import normalize
from builder.lock import record as lock_record
from builder.nightly import page
from builder.nightly.history import History
from builder.pipeline import accepting, nightly_runs
from builder.report import document
from tests.fixture_types import DemoAccepted, MakeReportInputs
from tests.history_nights import SLOW_REASON, ZERO_REASON, AfterRow, Plan, demo_plans, webhook, write_nights
from tests.rich_report import rich_report

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--remote-debugging-port=0", "--remote-allow-origins=*"]
RED = "rgb(207, 34, 46)"  # #cf222e, the failing night's colour
SCREENSHOTS = Path(__file__).resolve().parents[2] / ".cache" / "screenshots"  # .cache/ is git-ignored


@dataclass
class Loaded:
    """What the browser saw while loading one page."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


class Browser:
    """One page target of a headless Chromium, driven over the DevTools protocol."""

    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, timeout=30)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def load(self, path: Path) -> Loaded:
        self.events.clear()
        self.call("Page.navigate", url=path.as_uri())
        deadline = time.monotonic() + 30
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            assert time.monotonic() < deadline, "the page did not load in 30 s"
            self.events.append(json.loads(self.ws.recv()))
        self.call("Runtime.evaluate", expression="1")  # events sent during the load arrive before this answer
        seen = Loaded()
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
                seen.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                seen.errors.append(f"{details.get('text')} {details.get('exception', {}).get('description')}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                seen.errors.append(str(params["entry"].get("text")))
            elif method == "Network.requestWillBeSent":
                seen.requests.append(str(params.get("request", {}).get("url")))
        return seen

    def value(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def screenshot(self, name: str) -> Image.Image:
        """The whole page as PNG, saved as .cache/screenshots/<name>.png and returned decoded."""
        shot = base64.b64decode(self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        (SCREENSHOTS / f"{name}.png").write_bytes(shot)
        return Image.open(io.BytesIO(shot)).convert("RGB")


def not_blank(image: Image.Image) -> bool:
    """More than a background: at least 1% of the pixels differ from the top-left one, in more than 8 colours."""
    small = image.resize((min(image.width, 400), min(image.height, 800)))
    pixels = list(small.get_flattened_data())
    other = sum(1 for p in pixels if p != pixels[0])
    return other > len(pixels) // 100 and len(set(pixels)) > 8


def _chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        reason = "needs Debian's chromium (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI must run the browser test")
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    profile = Path(tempfile.mkdtemp(prefix="chromium-"))
    proc = subprocess.Popen([_chromium_binary(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "chromium did not start its DevTools server"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            pages = [t for t in json.load(answer) if t.get("type") == "page"]
        client = Browser(pages[0]["webSocketDebuggerUrl"])
        yield client
        client.ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _plans(count: int) -> list[Plan]:
    """`count` nights, the slow PR failing two in every 10, the zero_update defect one in every 15."""
    out = []
    for night in range(count):
        commit = f"{night + 1:040x}"
        failing = ({"performance": SLOW_REASON} if night % 10 in (3, 4) else
                   {"zero_update": ZERO_REASON} if night % 15 == 8 else {})
        out.append(Plan(commit, failing, slow=12.0 if "performance" in failing else 1.0))
    return out


def _checked(browser: Browser, path: Path) -> None:
    """No console error or warning, and nothing loaded from anywhere but the file itself."""
    seen = browser.load(path)
    assert seen.errors == []
    assert [u for u in seen.requests if not u.startswith(("file://", "data:"))] == []


def _check_nights(browser: Browser, count: int, failing: int) -> None:
    assert browser.value("document.querySelectorAll('.charts svg').length") == 1
    assert browser.value("document.querySelectorAll('.charts svg g[id^=axes_]').length") == 5
    assert browser.value("document.querySelectorAll('table.nights tbody tr').length") == count
    assert browser.value("document.querySelectorAll('.strip a').length") == count
    rows = browser.value("[...document.querySelectorAll('table.nights tbody tr.failing')].map("
                         "r => getComputedStyle(r.cells[0]).borderLeftColor)")
    squares = browser.value("[...document.querySelectorAll('.strip a.bad')].map(a => getComputedStyle(a).backgroundColor)")
    assert rows == [RED] * failing and squares == [RED] * failing


@pytest.mark.slow
@pytest.mark.parametrize("count", [0, 1, 60])
def test_the_page_in_chromium(browser: Browser, report_inputs: MakeReportInputs, settings: Settings, tmp_path: Path,
                              count: int) -> None:
    pins, sources, built, result = report_inputs()
    base = document.make_report(pins, lock_record.of(pins), sources, built, result)
    history = History(tmp_path / "history" / "runs.sqlite")
    write_nights(base, _plans(count), tmp_path / "runs", history)
    path = nightly_runs.history_page(replace(settings, cache_root=tmp_path / "cache"), history=history)
    _checked(browser, path)
    if count == 0:
        assert browser.value("document.getElementById('empty') !== null") is True
        return
    failing = sum(1 for p in _plans(count) if p.failing)
    _check_nights(browser, count, failing)


@pytest.mark.slow
def test_a_planted_console_error_and_remote_request_are_caught(browser: Browser, tmp_path: Path) -> None:
    planted = tmp_path / "planted.html"
    planted.write_text('<!DOCTYPE html><html><body><img src="https://example.invalid/x.png">'
                       '<script>console.error("planted error"); undefined_name();</script></body></html>')
    seen = browser.load(planted)
    assert any("planted error" in e for e in seen.errors) and any("undefined_name" in e for e in seen.errors)
    assert "https://example.invalid/x.png" in seen.requests


def _demo_nights(accepted: DemoAccepted, settings: Settings, local: Settings, history: History, tmp_path: Path,
                 after_row: AfterRow) -> tuple[list[Path], Report]:
    """The demo nights from the real accepted report; the slow PR's build gets a manifest whose top layer moved
    (the real manifest, from the session's blob store, with its last layer's digest and size changed)."""
    pins, sources, built, result = accepted
    base = document.make_report(pins, lock_record.of(pins), sources, built, result)
    real = normalize.blob_path(settings, built.manifest_digest).read_bytes()
    normalize.blob_path(local, built.manifest_digest).write_bytes(real)
    manifest = json.loads(real)
    top = dict(manifest["layers"][-1], digest="sha256:" + "5e" * 32, size=manifest["layers"][-1]["size"] + 4096)
    slow = json.dumps({**manifest, "layers": [*manifest["layers"][:-1], top]}).encode()
    slow_digest = "sha256:" + hashlib.sha256(slow).hexdigest()
    normalize.blob_path(local, slow_digest).write_bytes(slow)
    repo = Path(sources.components["vllm"].url)
    good, slow_head, defect = (_pr_head(repo, pr) for pr in (11, 14, 12))
    plans = demo_plans(good, slow_head, defect, good)
    plans[2] = replace(plans[2], manifest=slow_digest)
    return write_nights(base, plans, tmp_path / "runs", history, after_row=after_row), base


def _pr_head(repo: Path, pr: int) -> str:
    done = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", f"refs/pull/{pr}/head"], capture_output=True,
                          text=True, check=True, timeout=30)
    return done.stdout.strip()


@pytest.mark.docker
def test_the_demo_nights_from_the_real_report(browser: Browser, demo_accepted: DemoAccepted, settings: Settings,
                                              tmp_path: Path) -> None:
    history = History(tmp_path / "history" / "runs.sqlite")
    with webhook() as hook:
        local = replace(settings, cache_root=tmp_path / "cache", notify_url=hook.url)

        def after_row(run_dir: Path, diff: dict[str, Any]) -> None:  # what `builder nightly` runs after its row
            flag = diff["regression"]
            nightly_runs.nightly_page(history, run_dir, local, bool(flag["flag"]), flag["reasons"], None)

        paths, base = _demo_nights(demo_accepted, settings, local, history, tmp_path, after_row)
    assert [m["text"].split(": ", 2)[2] for m in hook.received] == [
        "verdict flipped: ACCEPTED -> NOT ACCEPTED", "verdict flipped: NOT ACCEPTED -> ACCEPTED"]
    nights = page.nights(history, base.name, 365, page.FactsCache(tmp_path / "cache.json"))
    assert [n.classes for n in nights] == [{}, {}, {"performance": "new"}, {"zero_update": "new", "performance": "fixed"},
                                           {"zero_update": "recurring"}, {"zero_update": "fixed"}]
    path = history.path.parent / page.PAGE  # written by the last night's call
    _checked(browser, path)
    _check_nights(browser, 6, 3)
    text = nightly_runs.compare(str(paths[1]), str(paths[2]), local, history=history)
    slow = document.load(paths[2]).sources.components["vllm"].commit
    assert f"`{slow[:12]}` | **yes**" in text and "sha256:5e5e5e5e5e5e" in text


def _cells(browser: Browser, selector: str) -> list[list[str]]:
    """The rows of the table `selector` as the browser laid them out: each cell's rendered text."""
    return browser.value(f"[...document.querySelectorAll('{selector} tr')].map(r => [...r.cells].map("
                         "c => c.innerText.trim()))") or []


@pytest.mark.slow
def test_the_report_page_in_chromium(browser: Browser, report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    report = rich_report(report_inputs)
    failed = report.model_copy(update={"verdict": "NOT ACCEPTED", "reasons": ["required gate control: fail (planted)"]})
    document.write(failed, tmp_path)
    path = tmp_path / "report.html"
    path.write_text(accepting.report_html(tmp_path / "report.json"))
    _checked(browser, path)
    assert not_blank(browser.screenshot("report"))
    assert not not_blank(Image.new("RGB", (400, 800), "white"))  # the check can fail: a blank page is caught
    assert browser.value("document.getElementById('verdict').innerText") == "NOT ACCEPTED"
    assert browser.value("getComputedStyle(document.getElementById('verdict')).backgroundColor") == RED
    gates = {row[0]: row for row in _cells(browser, "#gates")[1:]}
    assert set(gates) >= {g.name for g in report.gates} and gates["rl_step"][2] == "pass"
    census = _cells(browser, "#section-census table")
    assert any(row[:4] == ["rl_step", "n1", "3", "2"] and "77 /usr/bin/planted-helper" in row[-1] for row in census)
    assert any(row[:2] == ["n1", "ab" * 8] for row in _cells(browser, "#section-cluster table"))
    assert any("planted_kernel_k1" in row for row in _cells(browser, "#section-jit table"))
    link = browser.value("document.querySelector('#section-replay a').href")
    assert link == (tmp_path / "replay" / "rl_step.json").as_uri()


@pytest.mark.slow
def test_the_compare_page_in_chromium(browser: Browser, report_inputs: MakeReportInputs, settings: Settings,
                                      tmp_path: Path) -> None:
    pins, sources, built, result = report_inputs()
    base = document.make_report(pins, lock_record.of(pins), sources, built, result)
    history = History(tmp_path / "history" / "runs.sqlite")
    paths = write_nights(base, _plans(4), tmp_path / "runs", history)  # night 4 fails performance
    local = replace(settings, cache_root=tmp_path / "cache")
    path = tmp_path / "compare.html"
    path.write_text(nightly_runs.compare(str(paths[2]), str(paths[3]), local, fmt="html", history=history))
    _checked(browser, path)
    assert not_blank(browser.screenshot("compare"))
    commits = {row[0]: row for row in _cells(browser, "table.compare-commits")[1:]}
    new = document.load(paths[3]).sources.components["vllm"].commit
    assert commits["vllm"][3] == new[:12] and commits["vllm"][4] == "yes"
    assert commits["megatron"][4] == "no"
    moved = browser.value("[...document.querySelectorAll('table.compare-evidence tr.flagged')].map("
                          "r => r.cells[0].innerText)")
    assert "performance" in moved
