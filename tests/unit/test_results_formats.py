"""One run, one list of tests: junit.xml and ctrf.json list the same cases in the same suites (acceptance: the
gates; placement: sqsh_smoke once a .sqsh is placed), with the same statuses, because both are written from
builder/report/results.py; the signed in-toto test result lists the acceptance suite of that same list."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from builder.core.records import Report, SqshExport
from builder.lock import record as lock_record
from builder.release import attest
from builder.report import document, results
from builder.report.ctrf import STATUS, to_ctrf
from tests.fixture_types import MakeReportInputs

JUNIT = {"failure": "fail", "error": "inconclusive", "skipped": "not_run", "system-out": "pass"}
CLUSTER_SMOKE = {"status": "not_run", "reason": "the cluster gates ran on this file"}


def _report(report_inputs: MakeReportInputs, sqsh: bool) -> tuple[Report, Any]:
    pins, sources, built, result = report_inputs(statuses={"rl_step": "fail", "control": "inconclusive"})
    report = document.make_report(pins, lock_record.of(pins), sources, built, result)
    if sqsh:
        placed = SqshExport(path="/x.sqsh", sha256="5" * 64, size=1, compression="-comp lzo -noD",
                            mksquashfs="mksquashfs version 4.5.1", mksquashfs_args=[], image_id=report.image_id,
                            tag="TAG", registry_digest="sha256:" + "9" * 64, entries=10, files=8, xattrs=False,
                            enroot_files={}, equivalence="pass", smoke=CLUSTER_SMOKE, seconds={},
                            created="2026-11-29T00:00:00Z")
        report = report.model_copy(update={"sqsh": placed})
    return report, pins


def _junit(report: Report) -> list[tuple[str, str, str]]:
    root = ET.fromstring(document.to_junit(report))
    out = []
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            kind = next(child.tag for child in case if child.tag in JUNIT)
            out.append((str(suite.get("name")), str(case.get("name")), JUNIT[kind]))
    assert root.get("tests") == str(len(out))
    return out


def _ctrf(report: Report) -> list[tuple[str, str, str]]:
    tests = to_ctrf(report)["results"]["tests"]
    assert all(STATUS[t["extra"]["builder_status"]] == t["status"] for t in tests)
    return [(t["suite"][0], t["name"], t["extra"]["builder_status"]) for t in tests]


def test_every_format_lists_the_same_cases(report_inputs: MakeReportInputs) -> None:
    for sqsh in (False, True):
        report, pins = _report(report_inputs, sqsh)
        listed = [(c.suite, c.name, c.status) for cases in results.suites(report).values() for c in cases]
        assert _junit(report) == _ctrf(report) == listed
        statement = attest.test_result(report, pins, b"pins")
        signed = statement["passedTests"] + statement["failedTests"] + statement["warnedTests"]
        assert sorted(signed) == sorted(c.name for c in results.suites(report)[results.ACCEPTANCE])
    assert listed[-1] == ("placement", "sqsh_smoke", "not_run") and len(listed) == 6
    assert "sqsh_smoke" not in signed  # signed at acceptance, before the .sqsh was placed


def test_a_case_left_out_of_one_format_is_caught(report_inputs: MakeReportInputs, monkeypatch: Any) -> None:
    """The comparison can fail: CTRF written from the gates alone (as before) misses the placement suite."""
    report, _ = _report(report_inputs, sqsh=True)
    real = results.suites
    monkeypatch.setattr(results, "suites", lambda r: {results.ACCEPTANCE: real(r)[results.ACCEPTANCE]})
    ctrf = _ctrf(report)
    monkeypatch.undo()
    assert _junit(report) != ctrf
