"""CTRF (Common Test Report Format, ctrf.io) JSON of the acceptance gates, beside junit.xml."""
from __future__ import annotations

import calendar
import time
from typing import Any

from builder import __version__ as BUILDER_VERSION
from builder.core.records import Report

STATUS = {"pass": "passed", "fail": "failed", "not_run": "skipped", "inconclusive": "other"}


def _epoch_ms(stamp: str) -> int:
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) * 1000
    except (TypeError, ValueError):
        return 0


def to_ctrf(report: Report) -> dict[str, Any]:
    tests = []
    for gate in report.gates:
        seconds = gate.evidence.seconds
        test = {"name": gate.name, "status": STATUS[gate.status],
                "duration": int(seconds * 1000) if isinstance(seconds, (int, float)) else 0,
                "message": gate.reason, "extra": {"suite": "acceptance", "required": gate.name in report.required_gates,
                                                  "builder_status": gate.status}}
        if gate.status in ("fail", "inconclusive") and gate.log:
            test["trace"] = gate.log[-4000:]
        tests.append(test)
    stop = _epoch_ms(report.created)
    start = stop - sum(int(str(t["duration"])) for t in tests) if stop else 0
    summary = {"tests": len(tests), **{k: sum(1 for t in tests if t["status"] == k)
                                        for k in ("passed", "failed", "pending", "skipped", "other")},
               "start": start, "stop": stop}
    return {"reportFormat": "CTRF", "specVersion": "0.0.0", "generatedBy": f"rl-image-builder {BUILDER_VERSION}",
            "results": {"tool": {"name": "rl-image-builder", "version": BUILDER_VERSION}, "summary": summary,
                        "tests": tests,
                        "environment": {"appName": report.name, "buildName": report.image_id,
                                        "extra": {"verdict": report.verdict, "repository": report.repository}}}}
