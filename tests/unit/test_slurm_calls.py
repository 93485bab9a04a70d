"""The builder's Slurm client calls, without a cluster: polls pause at least a second and back off, a step that ran
to its end costs no call past its accounting record, and the nodes' states are one sinfo."""
from __future__ import annotations

from itertools import islice
from typing import Any

import pytest

from builder.runners import slurm


def test_pauses_start_at_a_second_and_back_off_to_the_cap() -> None:
    waits = list(islice(slurm.pauses(), 8))
    assert waits[0] == 1.0 and waits == sorted(waits) and waits[-1] == 5.0
    assert min(islice(slurm.pauses(first=0.1, most=0.2), 5)) == 1.0  # never more often than once a second


def test_step_record_waits_with_the_pauses_until_the_state_is_final(monkeypatch: pytest.MonkeyPatch) -> None:
    states = iter(["RUNNING", "COMPLETING", "COMPLETED"])
    monkeypatch.setattr(slurm, "records", lambda job: [{"JobID": job, "JobName": "builder-accept-r1", "State": "RUNNING"},
                                                       {"JobID": f"{job}.0", "JobName": "g-1", "State": next(states)}])
    slept: list[float] = []
    monkeypatch.setattr("builder.runners.slurm.time.sleep", slept.append)
    found = slurm.step_record("7", "g-1")
    assert found["State"] == "COMPLETED" and found["JobID"] == "7.0" and found["JobState"] == "RUNNING"  # one call
    assert slept == [1.0, 1.5]


def _runner() -> Any:
    from builder.core.options import Settings
    from builder.core.records import SqshFacts
    from builder.gating import plan
    from builder.runners.slurm_runner import SlurmRunner
    from tests.unit.test_cluster_unit import _pins

    pins = _pins(runtime="enroot", shared_dir="/shared")
    pins = pins.model_copy(update={"acceptance": pins.acceptance.model_copy(update={"nodes": 2})})
    made = plan.make(pins, plan.Flags(slurm=True, gates=["provenance"]), Settings.from_env()).acceptance
    runner = SlurmRunner(pins, made, SqshFacts(path="/shared/img.sqsh", sha256="ab" * 32), run_id="r1")
    runner.job = "4242"
    return runner


def test_a_completed_step_costs_no_call_past_its_record(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []

    def tool(name: str) -> str:
        called.append(name)
        raise AssertionError(f"{name} called")

    monkeypatch.setattr(slurm, "tool", tool)
    record = {"JobID": "4242.1", "State": "COMPLETED", "ExitCode": "0:0", "JobState": "RUNNING"}
    assert _runner()._ended(record, "provenance-1", False, 600, "", {}) is None and called == []
    with pytest.raises(AssertionError, match="scontrol called"):  # a failed step asks why: the job's state
        _runner()._ended({**record, "State": "FAILED", "ExitCode": "1:0"}, "provenance-1", False, 600, "", {})


@pytest.mark.parametrize("job, words", [("CANCELLED by 0", "cancelled outside the builder (scancel): job 4242"),
                                         ("TIMEOUT", "the allocation ran out: job 4242 TIMEOUT")])
def test_a_step_recorded_completed_under_an_ended_job_is_judged_by_the_job(
        monkeypatch: pytest.MonkeyPatch, job: str, words: str) -> None:
    """Slurm may record a step it killed when it ended the job (someone's scancel, the allocation's time limit) as
    COMPLETED 0:0; the job's own sacct row, read in the same call, says the job ended: the gate is inconclusive for
    the job's reason, never a fail for the missing result lines."""
    state = job.split()[0]
    monkeypatch.setattr(slurm, "job_state", lambda _: {"JobState": state, "StartTime": "2026-12-04T14:00:00"})
    monkeypatch.setattr(slurm, "node_states", lambda nodes: {n: "idle" for n in nodes})
    monkeypatch.setattr(slurm, "down_since", lambda nodes, since: [])
    record = {"JobID": "4242.1", "State": "COMPLETED", "ExitCode": "0:0", "JobState": job}
    facts: dict[str, Any] = {"node": "n[1-2]"}
    ended = _runner()._ended(record, "provenance-1", False, 600, "", facts)
    assert ended is not None and ended.status == "inconclusive" and ended.reason.startswith(words), ended
    assert facts["job_state"] == state
    monkeypatch.setattr(slurm, "job_state", lambda _: {})  # Slurm forgot the job: its accounting record decides
    ended = _runner()._ended(record, "provenance-1", False, 600, "", {"node": "n[1-2]"})
    assert ended is not None and ended.status == "inconclusive" and ended.reason.startswith(words.split(" job")[0])


def test_the_nodes_states_are_one_sinfo_call(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    class Done:
        returncode, stdout = 0, "n1 idle\nn2 down*\n"

    def run(argv: list[str], **_: Any) -> Done:
        seen.append(argv)
        return Done()

    monkeypatch.setattr(slurm, "tool", lambda name: name)
    monkeypatch.setattr("builder.runners.slurm.subprocess.run", run)
    assert slurm.node_states(["n1", "n2"]) == {"n1": "idle", "n2": "down*"} and len(seen) == 1
    assert seen[0][:5] == ["sinfo", "-h", "-N", "-n", "n1,n2"]
