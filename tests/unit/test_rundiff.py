"""Nightly comparison, history and CTRF without Docker: regression flag (planted ratio drop, gate
pass -> other), file and commit changes, no change, last accepted run, CTRF status mapping."""
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.core.records import GateStatus, Report
from builder.lock import record as lock_record
from builder.nightly import rundiff
from builder.nightly.history import History
from builder.report import ctrf
from tests.fixture_types import MakeReportInputs

MakeReport = Callable[..., Report]  # (ratio, statuses, image_id) -> a report


@pytest.fixture
def reports(report_inputs: MakeReportInputs) -> MakeReport:
    from builder.report import document as report_mod

    def make(ratio: float = 1.0, statuses: dict[str, GateStatus | None] | None = None,
             image_id: str = "sha256:" + "ab" * 32) -> Report:
        pins, sources, built, result = report_inputs(statuses=statuses, image_id=image_id)
        if result is not None:
            result = result.model_copy(update={"throughput": {**result.throughput, "ratio": ratio}})
        return report_mod.make_report(pins, lock_record.of(pins), sources, built, result)

    return make


def manifest(files: dict[str, str]) -> dict[str, Any]:
    return {"components": {"verl": {"files": files}}, "distributions": {"tinyrl": "0.4.0"}}


def test_same_inputs_say_no_change(reports: MakeReport) -> None:
    old, new = reports(), reports()
    m = manifest({"/a.py": "1"})
    diff = rundiff.compare(new, m, "sha256:" + "9" * 64, old, m, "sha256:" + "9" * 64, 0.05, {})
    assert diff["no_change"] and diff["summary"].startswith("no change") and not diff["regression"]["flag"]
    assert "no change" in rundiff.to_markdown(diff)


def test_files_and_metrics_differences(reports: MakeReport) -> None:
    old, new = reports(ratio=1.0), reports(ratio=0.97, image_id="sha256:" + "cd" * 32)
    diff = rundiff.compare(new, manifest({"/a.py": "2", "/c.py": "3"}), None, old,
                           manifest({"/a.py": "1", "/b.py": "1"}), None, 0.05, {})
    assert diff["files"] == {"added": ["/c.py"], "removed": ["/b.py"], "changed": ["/a.py"]}
    ratio = next(m for m in diff["metrics"] if m["metric"] == "throughput.ratio")
    assert ratio["delta"] == pytest.approx(-0.03) and ratio["relative"] == pytest.approx(-0.03)
    assert not diff["regression"]["flag"] and not diff["no_change"]  # -3% is within the 5% threshold


def test_planted_throughput_ratio_drop_raises_the_flag(reports: MakeReport) -> None:
    diff = rundiff.compare(reports(ratio=0.9), None, None, reports(ratio=1.0), None, None, 0.05, {})
    assert diff["regression"]["flag"]
    assert "throughput ratio" in diff["regression"]["reasons"][0]


def test_planted_gate_pass_to_inconclusive_raises_the_flag(reports: MakeReport) -> None:
    diff = rundiff.compare(reports(statuses={"control": "inconclusive"}), None, None, reports(), None, None, 0.05, {})
    assert diff["gates"] == [{"gate": "control", "old": "pass", "new": "inconclusive"}]
    assert diff["regression"]["reasons"] == ["gate control: pass -> inconclusive"]


def test_first_run_has_nothing_to_compare(reports: MakeReport, tmp_path: Path) -> None:
    diff = rundiff.compare(reports(), None, None, None, None, None, 0.05, {})
    paths = rundiff.write(diff, tmp_path)
    assert json.loads(paths["json"].read_text())["previous"] is None
    assert "nothing to compare" in paths["md"].read_text()


def test_history_last_accepted_skips_not_accepted_and_missing_reports(tmp_path: Path) -> None:
    h = History(tmp_path / "h.sqlite")
    report = tmp_path / "r1.json"
    report.write_text("{}")
    h.add("p", "t1", "ACCEPTED", "sha256:1", None, {"verl": "a"}, report, 0, False)
    h.add("p", "t2", "NOT ACCEPTED", "sha256:2", None, {"verl": "b"}, report, 1, False)
    h.add("q", "t3", "ACCEPTED", "sha256:3", None, {}, report, 0, False)
    h.add("p", "t4", "ACCEPTED", "sha256:4", None, {}, tmp_path / "gone.json", 0, False)
    run = h.last_accepted("p")
    assert run is not None
    assert run.image_id == "sha256:1" and run.commits == {"verl": "a"}
    assert [r.verdict for r in h.runs("p")] == ["ACCEPTED", "NOT ACCEPTED", "ACCEPTED"]
    assert h.last_accepted("none") is None


def test_ctrf_maps_gate_statuses(reports: MakeReport) -> None:
    doc = ctrf.to_ctrf(reports(statuses={"control": "inconclusive", "rl_step": "fail", "zero_update": None}))
    assert doc["reportFormat"] == "CTRF"
    status = {t["name"]: t["status"] for t in doc["results"]["tests"]}
    assert status == {"provenance": "passed", "zero_update": "skipped", "rl_step": "failed", "control": "other",
                      "performance": "passed"}
    summary = doc["results"]["summary"]
    assert (summary["tests"], summary["passed"], summary["failed"], summary["skipped"], summary["other"]) == (5, 2, 1, 1, 1)


def test_the_nightly_diff_reads_commits_and_gates_as_builder_compare_does(reports: MakeReport) -> None:
    """One way to diff two reports: the nightly's commits and gate changes are the compare's rows (a gate the
    old run did not have reads not_run, and not_run against not_run is no change)."""
    from builder.nightly import compare

    old, new = reports(), reports(statuses={"rl_step": "fail", "control": "not_run"})
    old = old.model_copy(update={"gates": [g for g in old.gates if g.name != "control"]})  # a report without it
    diff = rundiff.compare(new, None, None, old, None, None, 0.05, {})
    rows = {e["gate"]: next(i for i in e["items"] if i["what"] == "status") for e in compare.evidence(old, new)}
    assert diff["gates"] == [{"gate": g, "old": r["old"] or "not_run", "new": r["new"]} for g, r in rows.items()
                             if r["moved"] and (r["old"] or "not_run") != r["new"]]
    assert diff["gates"] == [{"gate": "rl_step", "old": "pass", "new": "fail"}]
    assert {c["component"]: c["moved"] for c in compare.commits(old, new)} == \
        {name: c["changed"] for name, c in diff["commits"].items()}
