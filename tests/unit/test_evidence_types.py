"""The gate evidence and runner facts typed (builder/core/records.py Evidence, ArmStats, DockerFacts, SlurmFacts):
a stored report.json of the current format still loads, with its numbers typed; an older suite's unknown keys are
kept; a value of another shape is never a reason to refuse a gate's output (the typed field reads None)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from builder.core.records import AcceptanceResult, ArmStats, DockerFacts, Evidence, Report, SlurmFacts
from builder.gating import replay
from builder.nightly import compare, page
from builder.release import trust
from builder.report import document

DATA = Path(__file__).resolve().parents[1] / "data" / "reports"
STORED = DATA / "cluster-2026-12-04.json"  # trimmed, real run, written before the evidence was typed
CURRENT = DATA / "cluster-typed-2026-12-04.json"  # a real two-node run, trimmed, written by the typed records


def _kept(raw: object, dumped: object, where: str = "") -> list[str]:
    """Where a stored value did not come back as it was (a key dumped as None that the file lacks is no loss, nor an
    empty field of the other runner kind that a report written before the split named)."""
    if dumped == "<missing>" and raw in (None, "", [], {}):
        return []
    if isinstance(raw, dict) and isinstance(dumped, dict):
        return [w for k, v in raw.items() for w in _kept(v, dumped.get(k, "<missing>"), f"{where}.{k}")]
    if isinstance(raw, list) and isinstance(dumped, list) and len(raw) == len(dumped):
        return [w for i, (a, b) in enumerate(zip(raw, dumped)) for w in _kept(a, b, f"{where}[{i}]")]
    return [] if raw == dumped and type(raw) is type(dumped) else [f"{where}: {raw!r} -> {dumped!r}"]


@pytest.mark.parametrize("stored", [STORED, CURRENT], ids=["before-typing", "current"])
def test_every_stored_evidence_value_comes_back_as_it_was(stored: Path) -> None:
    """Loading a stored report and writing it again keeps every value it held: a nested record whose type does not
    fit what the suite or a runner wrote would read None and show here."""
    raw = json.loads(stored.read_text())
    report = document.load(stored)
    dumped = json.loads(report.model_dump_json(by_alias=True))
    if "container" in raw["acceptance"]:  # the runner's facts' name before it was `where`
        dumped["acceptance"]["container"] = dumped["acceptance"].pop("where")
    assert _kept(raw, dumped) == []  # the evidence, the runner's facts, the throughput, the build's isolation...
    assert Report.model_validate_json(report.model_dump_json()) == report


def test_a_report_of_the_current_format_reads_its_nested_records_typed() -> None:
    report = document.load(CURRENT)
    gates = {g.name: g.evidence for g in report.gates}
    census = gates["control"].census
    assert isinstance(census, dict) and set(census.get("nodes") or {}) == {"n1", "n2"}
    assert (census.get("images") or {}).get("n2") == census.get("image")
    rank = (gates["control"].ranks or [])[0]
    assert rank.get("node") == "n2" and ((rank.get("evidence") or {}).get("run") or {}).get("node_env") == {}
    processes = gates["control"].processes
    assert isinstance(processes, list) and all(isinstance(p.get("pid"), int) for p in processes)
    first = ((gates["control"].replay or {}).get("first") or [{}])[0]
    assert first.get("position") == [0, 0] and isinstance(first.get("trainer"), float)
    assert [r.get("arm") for r in gates["performance"].runs or []] == ["aligned", "control"]
    stamp = ((gates["provenance"].components or {}).get("vllm") or {}).get("stamp") or {}
    assert len(stamp.get("commit") or "") == 40
    assert all(lib.get("component") for lib in (gates["provenance"].native_libs_loaded or {}).values())
    assert ((gates["zero_update"].steps or {}).get("1") or {}).get("diff_max") == 0.0
    assert ((gates["zero_update"].run or {}).get("layout") or {}).get("address")


def test_a_stored_report_reads_in_history_compare_publish_and_replay(tmp_path: Path) -> None:
    """The readers of each command over a report of the current format: the history page's facts, compare's
    gate items and noise, publish's re-derived verdict of each gate, and replay's choice of a bundle."""
    report = document.load(CURRENT)
    facts = page.report_facts(report, tmp_path)
    assert facts["control_diff"] and facts["ratio"] == next(
        g for g in report.gates if g.name == "performance").evidence.ratio
    items = compare.gate_items(report)
    assert items["control"]["diff max"] and items["performance"]["aligned median"]
    assert not any(e["moved"] for e in compare.evidence(report, report)) and compare.noise(report, report)
    assert [trust.derive(g, 2) for g in report.gates if g.name != "performance"] == [None] * 4
    assert replay.choose(report.gates, "control", str(CURRENT))[1].get("count") == 176
    assert replay.nothing_failed(report)[-1].startswith("control: its difference (logprobs, 176 position(s)")


def test_an_older_suites_shapes_load() -> None:
    """Text where a record is now ("off ..." for the census and the process records), a list of checksums for the
    weights, unknown keys in a nested record: all kept; a key of another shape reads None, the rest stays."""
    ev = Evidence.model_validate({"census": "off (settings.census: false)", "processes": "off (settings.process_"
                                  "records: false)", "weights": ["abc"], "jit": {"count": 2, "seen_by": "old"},
                                  "replay": {"differs": True, "step": "one", "count": 3}})
    assert ev.census == "off (settings.census: false)" and ev.processes and ev.weights == ["abc"]
    assert ev.jit == {"count": 2, "seen_by": "old"}
    assert ev.replay == {"differs": True, "step": None, "count": 3}


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
