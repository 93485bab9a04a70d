"""CTRF (Common Test Report Format, ctrf.io) JSON of the run's test results (builder/report/results.py: the
gates, and the .sqsh smoke once placed), beside junit.xml."""
from __future__ import annotations

import calendar
import time
from typing import Any

from builder import __version__ as BUILDER_VERSION
from builder.core.records import Report
from builder.report import results

STATUS = {"pass": "passed", "fail": "failed", "not_run": "skipped", "inconclusive": "other"}


def _epoch_ms(stamp: str) -> int:
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) * 1000
    except (TypeError, ValueError):
        return 0


def to_ctrf(report: Report) -> dict[str, Any]:
    """ctrf.json: every case of results.suites (extra.suite names its suite), the same cases as junit.xml."""
    tests = []
    for case in (c for cases in results.suites(report).values() for c in cases):
        test = {"name": case.name, "status": STATUS[case.status], "suite": [case.suite],
                "duration": int(case.seconds * 1000) if case.seconds is not None else 0,
                "message": case.reason, "extra": {"suite": case.suite, "required": case.required,
                                                  "builder_status": case.status}}
        if case.status in ("fail", "inconclusive") and case.log:
            test["trace"] = case.log[-4000:]
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
