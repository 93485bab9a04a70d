"""A history of demo nights for the history page, `builder compare` and the notifications, without running a
nightly per night: each night is a real `Report` record derived from one real report (a gate's status, reason and
evidence, a component's commit, the created time changed), written with report.document.write into its own run
directory beside the nightly-diff.json that nightly.rundiff makes against the last accepted night, and added to a
real SQLite history as `builder nightly` adds its row. tests/integration/test_history_browser.py derives them from
the demo's accepted report (conftest demo_accepted), the unit tests from conftest report_inputs."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from builder.core.records import GateResult, GateStatus, Report
from builder.nightly import page, rundiff
from builder.nightly.history import History
from builder.report import document
from builder.report.html import plain


@dataclass(frozen=True)
class Plan:
    """One night: the vllm commit it ran (the head of demo PR `pr`) and the gates planted to fail (gate -> reason)."""

    vllm: str
    failing: dict[str, str] = field(default_factory=dict)
    slow: float = 1.0  # the aligned arm's throughput is divided by this
    manifest: str | None = None  # the build's OCI manifest digest (None: the base report's)
    pr: int = 11  # the demo's vllm PR whose head the commit is (tests/defects.py: 14 slow, 12 zero_update defect)


SLOW_REASON = "aligned / control perf/rollout_tokens_per_s 0.09 < min_ratio 0.16 (planted: the slow exact path)"
ZERO_REASON = "step 1: diff_max 0.0625, expected exactly 0.0 (planted: batch invariance off)"


def demo_plans(good: str, slow: str, defect: str, fixed: str) -> list[Plan]:
    """Good, good, the slow PR (performance fails: new), the zero_update defect (zero_update new, performance
    fixed), the defect again (recurring), the fix (fixed)."""
    return [Plan(good), Plan(good), Plan(slow, {"performance": SLOW_REASON}, slow=12.0, pr=14),
            Plan(defect, {"zero_update": ZERO_REASON}, pr=12), Plan(defect, {"zero_update": ZERO_REASON}, pr=12),
            Plan(fixed)]


def _slowed(evidence: dict[str, Any], factor: float) -> dict[str, Any]:
    ev: dict[str, Any] = json.loads(json.dumps(evidence))
    runs = [r for r in ev.get("runs") or [] if isinstance(r, dict)]
    for run in runs:
        if run.get("arm") == "aligned" and isinstance(run.get("throughput"), (int, float)):
            run["throughput"] = run["throughput"] / factor
    aligned = ev.get("aligned")
    if isinstance(aligned, dict) and isinstance(aligned.get("median"), (int, float)):
        aligned["median"] = aligned["median"] / factor
        aligned["runs"] = [v / factor if isinstance(v, (int, float)) else v for v in aligned.get("runs") or []]
    if isinstance(ev.get("ratio"), (int, float)):
        ev["ratio"] = ev["ratio"] / factor
    return ev


def derive(base: Report, plan: Plan, created: str) -> Report:
    """The base report with the plan's vllm commit, planted failures and slower aligned arm."""
    gates = []
    for gate in base.gates:
        status: GateStatus = "fail" if gate.name in plan.failing else gate.status
        evidence = _slowed(plain(gate.evidence), plan.slow) if gate.name == "performance" else plain(gate.evidence)
        evidence = {k: v for k, v in evidence.items() if v is not None}
        if gate.name == "zero_update" and gate.name in plan.failing:
            evidence = {**evidence, "steps": {"1": {"diff_max": 0.0625, "k3_kl": 0.001}}}
        gates.append(GateResult.model_validate({"name": gate.name, "status": status, "log": gate.log,
                                                "reason": plan.failing.get(gate.name, gate.reason), "evidence": evidence}))
    reasons = [f"required gate {g.name}: fail ({g.reason})" for g in gates
               if g.name in base.required_gates and g.status != "pass"]
    comps = dict(base.sources.components)
    comps["vllm"] = comps["vllm"].model_copy(update={"commit": plan.vllm, "pr_head": plan.vllm, "pr": plan.pr})
    update: dict[str, Any] = {"gates": gates, "reasons": reasons, "created": created,
                              "verdict": "NOT ACCEPTED" if reasons else "ACCEPTED",
                              "sources": base.sources.model_copy(update={"components": comps})}
    if base.acceptance is not None:
        tp = _slowed(plain(base.acceptance.throughput), plan.slow)
        update["acceptance"] = base.acceptance.model_copy(update={"gates": gates, "throughput": tp})
    if base.build is not None and plan.manifest:
        update["build"] = base.build.model_copy(update={"manifest_digest": plan.manifest})
    return base.model_copy(update=update)


AfterRow = Callable[[Path, dict[str, Any]], None]


def write_nights(base: Report, plans: list[Plan], root: Path, history: History, first_day: int = 1,
                 after_row: AfterRow | None = None) -> list[Path]:
    """Each plan as a run directory under root (report files, nightly-diff.json against the last accepted night,
    timings.json) and a history row, in order; the report.json paths. `after_row(run_dir, diff)` runs where
    `builder nightly` writes its page and notifies (right after the row)."""
    paths: list[Path] = []
    last_ok: Report | None = None
    for i, plan in enumerate(plans):
        started = f"2026-11-{first_day + i:02d}T03:17:00Z"
        report = derive(base, plan, started)
        run_dir = root / f"night-{first_day + i:02d}"
        document.write(report, run_dir)
        diff = rundiff.compare(report, None, None, last_ok, None, None, 0.05, {})
        rundiff.write(diff, run_dir)
        (run_dir / page.TIMINGS).write_text(json.dumps({"resolve sources": 1.5 + i / 10}))
        flag = bool(diff["regression"]["flag"])
        accepted = report.verdict == "ACCEPTED"
        code = (4 if flag else 0) if accepted else 1
        history.add(report.name, started, report.verdict, report.image_id, None,
                    {n: c.commit for n, c in report.sources.components.items()}, run_dir / "report.json", code, flag)
        if after_row is not None:
            after_row(run_dir, diff)
        last_ok = report if accepted else last_ok
        paths.append(run_dir / "report.json")
    return paths


@dataclass
class Hook:
    """A webhook receiver's state: its URL, each JSON body received, what it answers and how late."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    delay_s: float = 0.0
    trickle_s: float = 0.0  # > 0: the answer goes out one byte per trickle_s (no single read ever waits long)


@contextmanager
def webhook() -> Iterator[Hook]:
    """A webhook receiver on 127.0.0.1 (a free port) in a thread; its URL's path stands for a Slack secret."""
    state = Hook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.received.append(json.loads(body))
            time.sleep(state.delay_s)
            if state.trickle_s:
                for byte in f"HTTP/1.1 {state.status} OK\r\nContent-Length: 0\r\n\r\n".encode():
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(state.trickle_s)
                return
            self.send_response(state.status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/services/T000/B000/secret"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
