"""The gate evidence record typed (builder/core/records.py Evidence, ArmStats): a stored report.json of the current
format still loads, with its numbers typed; an older suite's unknown keys are kept; a value of another shape is
never a reason to refuse a gate's output (the typed field reads None)."""
from __future__ import annotations

from pathlib import Path

from builder.core.records import ArmStats, Evidence, Report
from builder.report import document

STORED = Path(__file__).resolve().parents[1] / "data" / "reports" / "cluster-2026-12-04.json"  # trimmed, real run


def test_a_stored_report_of_the_current_format_loads_with_typed_evidence() -> None:
    report = document.load(STORED)
    perf = next(g for g in report.gates if g.name == "performance").evidence
    assert isinstance(perf.pairs, int) and perf.stopped == f"decided after {perf.pairs} pairs"
    assert isinstance(perf.aligned, ArmStats) and isinstance(perf.aligned.median, float)
    assert isinstance(perf.ratio, float) and isinstance(perf.confidence, float) and perf.metric
    assert (perf.model_extra or {}).get("min_pairs") == 2  # a key the record does not name stays
    control = next(g for g in report.gates if g.name == "control").evidence
    assert isinstance(control.diff_max, float) and isinstance(control.exit_code, int)
    assert Report.model_validate_json(report.model_dump_json()) == report  # written and read back the same


def test_an_older_suites_unknown_keys_are_kept() -> None:
    ev = Evidence.model_validate({"diff_max": 0.0, "logprob_source": "engine", "steps_seen": [1, 2]})
    assert ev.diff_max == 0.0 and ev.as_dict()["logprob_source"] == "engine" and ev.get("steps_seen") == [1, 2]


def test_a_value_of_another_shape_reads_none_and_refuses_nothing() -> None:
    ev = Evidence.model_validate({"pairs": "three", "diff_max": True, "ratio": "0.5", "aligned": [1, 2],
                                  "gpu": 3, "failures": "one", "seconds": 5})
    assert (ev.pairs, ev.diff_max, ev.ratio, ev.aligned, ev.gpu, ev.failures) == (None,) * 6
    assert ev.seconds == 5.0  # an int is a number

