"""The gate evidence and runner facts typed (builder/core/records.py Evidence, ArmStats, DockerFacts, SlurmFacts):
a stored report.json of the current format still loads, with its numbers typed; an older suite's unknown keys are
kept; a value of another shape is never a reason to refuse a gate's output (the typed field reads None)."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from builder.core.records import AcceptanceResult, ArmStats, DockerFacts, Evidence, Report, SlurmFacts
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



def test_the_runner_facts_are_one_of_two_kinds_read_from_reports_before_the_split() -> None:
    """`AcceptanceResult.where` (named `container` before; stored reports still say so) holds DockerFacts or
    SlurmFacts; a report written before the split named every field of both kinds, the other kind's empty."""
    report = document.load(STORED)  # its acceptance says "container", with Docker's fields empty
    assert report.acceptance is not None and isinstance(report.acceptance.where, SlurmFacts)
    assert report.acceptance.where.job_id and report.acceptance.where.sqsh is not None
    assert '"where"' in report.model_dump_json() and '"container": {"runner"' not in report.model_dump_json()
    both: dict[str, object] = {"runner": "docker", "home": "tmpfs", "env": {"A": "1"}, "cluster": None, "job_id": None,
                               "nodes": [], "sqsh": None, "srun_args": [], "partition": None, "runtime": None,
                               "runtime_version": None}
    docker = AcceptanceResult.model_validate({"image_id": "x", "gates": [], "container": both}).where
    assert isinstance(docker, DockerFacts) and docker.env == {"A": "1"}
    with pytest.raises(ValidationError, match="home"):  # a field of the other kind with a value is refused
        AcceptanceResult.model_validate({"image_id": "x", "gates": [], "where": {"job_id": "7", "home": "tmpfs"}})
