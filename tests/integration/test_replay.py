"""Replay bundles: a planted zero-update defect (tinycore PR 23: weight decay not scaled by lr) leaves a bundle
that `builder replay` reproduces in a fresh container (exit 1) and that the good image no longer shows (exit 0);
a good run's report says there is nothing to replay; the accepted demo's replay says nothing failed (exit 0), and
its control arm's expected difference reproduces exactly with `--gate control` (exit 0). Replays go through the
gates' door (builder/runners/factory.py) and leave no container. Unit tests first (no Docker), then the real images."""
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from acceptance import replay as bundles
from builder.core.errors import BadInput
from builder.core.evidence import ReplaySummary
from builder.core.options import Settings
from builder.core.records import Evidence, GateResult, Report
from builder.gating import replay
from builder.lock import record as lock_record
from builder.pipeline import accepting
from builder.report import document
from builder.runners import docker_runner
from builder.runners import factory as runners
from tests.fixture_types import DemoAccepted, DockerClient

SETTINGS = Settings.from_env()
ROOT = Path(__file__).resolve().parents[2]


def _step(n: int, trainer: list[list[float]], rollout: list[list[float]], moved: int = 0,
          digest: str = "aa") -> dict[str, Any]:
    return {"step": n, "seed": 1, "sample_seed": 7, "prompts": [[1, 2]], "responses": [[3, 4]],
            "trainer_logprobs": trainer, "rollout_logprobs": rollout, "weights_before": digest,
            "weights_after": digest, "initial_weights": "aa",
            "weights_changed": {"count": moved, "first": [{"tensor": "w", "index": 0, "before": 1.0, "after": 0.5}]
                                if moved else []},
            "config": {"seed": 1}, "replay_entry": ["python", "-m", "tinyrl.replay"]}


def _capture(tmp_path: Path, *steps: dict[str, Any]) -> str:
    for s in steps:
        (tmp_path / f"step_{s['step']}.json").write_text(json.dumps(s))
    return str(tmp_path)


def test_bundle_takes_the_first_differing_step_and_position(tmp_path: Path) -> None:
    where = _capture(tmp_path, _step(1, [[-1.0, -2.0]], [[-1.0, -2.0]]),
                     _step(2, [[-1.0, -2.5]], [[-1.0, -2.25]], digest="bb"))
    (tmp_path / "step_2.weights").write_bytes(b"weights")
    found = bundles.bundle("rl_step", where, {"env": {"A": "1"}}, {"DEMO_BATCH_INVARIANT": "1"}, 0.001)
    assert found is not None and found["differs"] and found["step"] == 2 and found["kind"] == "logprobs"
    assert found["count"] == 1 and found["first"] == [{"position": [0, 1], "trainer": -2.5, "rollout": -2.25}]
    assert found["batch"] == {"prompts": [[1, 2]], "responses": [[3, 4]], "sample_seed": 7, "seed": 1}
    assert found["weights"]["digest"] == "bb" and found["weights"]["source"] == "inline"
    assert found["arm_env"] == {"DEMO_BATCH_INVARIANT": "1"} and found["recipe_env"] == {"A": "1"}


def test_zero_update_bundle_names_the_weights_the_step_moved(tmp_path: Path) -> None:
    where = _capture(tmp_path, _step(1, [[-1.0]], [[-1.0]], moved=3))
    found = bundles.bundle("zero_update", where, {}, {}, 0.0)
    assert found is not None and found["kind"] == "weights" and found["count"] == 3 and found["lr"] == 0.0
    assert found["weights"] == {"digest": "aa", "source": "initial (the recipe's seeded start)"}


def test_no_difference_is_nothing_to_replay_and_no_capture_is_no_bundle(tmp_path: Path) -> None:
    where = _capture(tmp_path, _step(1, [[-1.0]], [[-1.0]]))
    found = bundles.bundle("zero_update", where, {}, {}, 0.0)
    assert found is not None and not found["differs"] and found["note"].startswith("nothing to replay")
    assert bundles.bundle("control", str(tmp_path / "none"), {}, {}, 0.0) is None


def test_nan_logprobs_differ(tmp_path: Path) -> None:
    where = _capture(tmp_path, _step(1, [[float("nan")]], [[-1.0]]))
    found = bundles.bundle("rl_step", where, {}, {}, 0.001)
    assert found is not None and found["differs"] and found["count"] == 1


def test_report_keeps_a_pointer_and_the_file_keeps_the_weights() -> None:
    full = {"differs": True, "kind": "logprobs", "step": 2, "count": 1, "first": [],
            "weights": {"digest": "bb", "source": "inline", "data": "QUJD"}}
    gates = [GateResult(name="rl_step", status="fail", reason="x", evidence=Evidence.model_validate({"replay": full})),
             GateResult(name="zero_update", status="pass", reason="y",
                        evidence=Evidence.model_validate({"replay": {"differs": False}}))]
    kept, files = replay.split(gates)
    assert files == {"rl_step": full}
    assert kept[0].evidence.model_dump(mode="json")["replay"]["file"] == "replay/rl_step.json"
    assert "data" not in kept[0].evidence.model_dump(mode="json")["replay"]["weights"] and kept[1] is gates[1]
    assert replay.split(kept)[1] == {}  # written once: a report written again keeps the first file
    assert replay.choose(kept, None, "r.json")[0] == "rl_step"
    with pytest.raises(BadInput, match="no replay bundle for gate control"):
        replay.choose(kept, "control", "r.json")
    with pytest.raises(BadInput, match="--gate: expected one of"):
        replay.choose(kept, "provenance", "r.json")


def test_lines_name_the_first_position_and_both_values() -> None:
    out = replay.lines("zero_update", {"differs": True, "step": 1, "kind": "weights", "count": 5, "image": "sha256:x",
                                       "seconds": 4.2, "first": [{"tensor": "w", "index": 3, "before": 1.0,
                                                                  "after": 0.99}]})
    assert out == ["zero_update step 1 (weights, image sha256:x, 4.2 s): DIFFERS at 5 position(s)",
                   "first: w[3]: before 1.0, after 0.99"]
    assert replay.lines("rl_step", {"differs": False, "step": 2, "kind": "logprobs"})[0].endswith("equal: no position differs")


def _control_report(verdict: str = "ACCEPTED") -> Report:
    summary = {"differs": True, "kind": "logprobs", "step": 1, "count": 171, "file": "replay/control.json",
               "first": [{"position": [0, 3], "trainer": -1.5, "rollout": -1.25}]}
    control = GateResult(name="control", status="pass", reason="arms differ",
                         evidence=Evidence.model_validate({"replay": summary}))
    return Report.model_construct(verdict=verdict, image_id="sha256:" + "ab" * 32, gates=[control])


def test_an_accepted_run_says_nothing_failed_and_names_the_control_difference_as_evidence() -> None:
    out = replay.nothing_failed(_control_report())
    assert out[0] == f"nothing failed: ACCEPTED (image sha256:{'ab' * 32}); no gate to replay"
    assert out[1] == ("control: its difference (logprobs, 171 position(s) at step 1) is the expected evidence that "
                      "the arms differ; replay it with --gate control")


def test_control_passes_only_when_its_difference_reproduces_exactly() -> None:
    summary = _control_report().gates[0].evidence.replay
    assert summary is not None
    first = (summary.get("first") or [])[:1]
    same: ReplaySummary = {"differs": True, "kind": "logprobs", "step": 1, "count": 171, "first": first}
    lines, code = replay.verdict("control", summary, same)
    assert code == 0 and lines[-1].startswith("control: the recorded difference reproduces exactly"), lines
    others: list[ReplaySummary] = [{**same, "count": 170}, {**same, "first": [{**first[0], "rollout": -1.0}]},
                                   {"differs": False, "kind": "logprobs", "step": 1}]
    for other in others:
        lines, code = replay.verdict("control", summary, other)
        assert code == 1 and lines[-1] == "control: the recorded difference (171 position(s)) did not reproduce"
    assert replay.verdict("rl_step", summary, same)[1] == 1  # a gate that must agree fails while it differs
    assert replay.verdict("rl_step", summary, {"differs": False})[1] == 0


# ---- real images ------------------------------------------------------------------------------------------


def _report(demo_image: Any, built: Any, result: Any, out: Path) -> Path:
    pins, resolved, _, _ = demo_image
    document.write(document.make_report(pins, lock_record.of(pins), resolved, built, result), out)
    return out / "report.json"


def _cli(*args: str, run_id: str) -> subprocess.CompletedProcess[str]:
    """`builder replay ...` as a user runs it; its containers carry `run_id` (BUILDER_RUN_ID), which the run_id
    fixture checks are all gone afterwards."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BUILDER_RUN_ID": run_id}
    return subprocess.run([sys.executable, "-m", "builder", "replay", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def _removed(docker_client: DockerClient, run_id: str, since: float) -> list[str]:
    """The gates of the containers labelled with `run_id` that the engine destroyed since `since` (its events)."""
    label = f"{docker_runner.LABEL}={run_id}"
    events = docker_client.api.events(since=f"{since:.6f}", until=f"{time.time() + 1:.6f}", decode=True,
                                      filters={"type": "container", "event": "destroy", "label": label})
    return [str(e["Actor"]["Attributes"].get(f"{docker_runner.LABEL}.gate")) for e in events]


@pytest.mark.docker
@pytest.mark.slow
def test_planted_zero_update_defect_replays_and_not_on_the_good_image(
        demo_image: Any, build_variant: Any, docker_client: Any, run_id: str, tmp_path: Path) -> None:
    pins, _, _, good = demo_image
    bad = build_variant("megatron", 23)
    start = time.monotonic()
    result = runners.gate_local_image(bad.image_id, pins, SETTINGS, gates=["zero_update"], run_id=run_id)
    gate_s = time.monotonic() - start
    gate = next(g for g in result.gates if g.name == "zero_update")
    assert gate.status == "fail" and "weights changed with lr 0" in gate.reason
    found = gate.evidence.model_dump(mode="json")["replay"]
    assert found["differs"] and found["kind"] == "weights" and found["step"] == 1 and found["count"] > 0
    assert found["batch"]["prompts"] and found["batch"]["responses"] and found["weights"]["digest"]
    assert len(json.dumps(found)) < 64 * 1024  # small and bounded
    report_json = _report(demo_image, bad, result, tmp_path)
    assert document.load(report_json).verdict != "ACCEPTED"
    on_disk = json.loads((tmp_path / "replay" / "zero_update.json").read_text())
    assert on_disk["first"] == found["first"]
    assert "[replay/zero_update.json](replay/zero_update.json)" in (tmp_path / "report.md").read_text()
    start, since = time.monotonic(), time.time()
    cli = _cli(str(report_json), run_id=run_id)  # no --gate: the first gate that differed
    replay_s = time.monotonic() - start
    assert cli.returncode == 1, cli.stderr[-2000:]
    first = found["first"][0]
    assert cli.stdout.splitlines()[0].startswith(f"zero_update step 1 (weights, image {bad.image_id}, ")
    assert f"first: {first['tensor']}[{first['index']}]: before {first['before']!r}, after {first['after']!r}" \
        in cli.stdout
    assert [ln for ln in cli.stderr.splitlines() if ln.startswith("error:")] == \
        [f"error: replay: {cli.stdout.splitlines()[0]}"]
    assert _removed(docker_client, run_id, since) == ["replay"]  # one container, through the gates' door, gone
    print(f"zero_update gate {gate_s:.1f} s, replay (CLI, fresh container) {replay_s:.1f} s")  # bench_replay.py
    lines, differs = accepting.replay(report_json, dataclasses.replace(SETTINGS, run_id=run_id), gate="zero_update",
                                     image=good.image_id)
    assert not differs and lines[0].startswith(f"zero_update step 1 (weights, image {good.image_id}, ")
    assert lines[0].endswith("equal: no position differs"), lines


@pytest.mark.docker
@pytest.mark.slow
def test_good_run_report_says_nothing_to_replay(demo_image: Any, docker_client: Any, run_id: str,
                                                 tmp_path: Path) -> None:
    pins, _, _, good = demo_image
    result = runners.gate_local_image(good.image_id, pins, SETTINGS, gates=["zero_update"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "zero_update")
    assert gate.status == "pass" and gate.evidence.model_dump(mode="json")["replay"]["differs"] is False
    report_json = _report(demo_image, good, result, tmp_path)
    assert not (tmp_path / "replay").exists()
    assert "- zero_update: nothing to replay (nothing to replay: zero_update saw no difference" in \
        (tmp_path / "report.md").read_text()
    lines, differs = accepting.replay(report_json, SETTINGS)
    assert not differs and lines[0].startswith("zero_update: nothing to replay"), lines
    with pytest.raises(BadInput, match="no replay bundle for gate rl_step"):
        accepting.replay(report_json, SETTINGS, gate="rl_step")


@pytest.mark.docker
@pytest.mark.slow
def test_replay_of_the_accepted_demo_says_nothing_failed(demo_accepted: DemoAccepted, docker_client: DockerClient,
                                                          run_id: str, tmp_path: Path) -> None:
    pins, resolved, built, result = demo_accepted
    report_json = document.write(document.make_report(pins, lock_record.of(pins), resolved, built, result),
                                 tmp_path)["json"]
    report = document.load(report_json)
    assert report.verdict == "ACCEPTED", report.reasons
    control = next(g for g in report.gates if g.name == "control").evidence.model_dump(mode="json")["replay"]
    assert control["differs"] and control["count"] > 0 and (tmp_path / "replay" / "control.json").is_file()
    since = time.time()
    cli = _cli(str(report_json), run_id=run_id)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert cli.stdout.splitlines() == [
        f"nothing failed: ACCEPTED (image {built.image_id}); no gate to replay",
        f"control: its difference ({control['kind']}, {control['count']} position(s) at step {control['step']}) is "
        "the expected evidence that the arms differ; replay it with --gate control"]
    assert "error" not in cli.stderr
    assert _removed(docker_client, run_id, since) == []  # nothing to run: no container at all


@pytest.mark.docker
@pytest.mark.slow
def test_replay_of_the_control_arm_reproduces_its_difference_exactly(
        demo_accepted: DemoAccepted, docker_client: DockerClient, run_id: str, tmp_path: Path) -> None:
    pins, resolved, built, result = demo_accepted
    report_json = document.write(document.make_report(pins, lock_record.of(pins), resolved, built, result),
                                 tmp_path)["json"]
    control = next(g for g in document.load(report_json).gates if g.name == "control").evidence.model_dump(mode="json")["replay"]
    since = time.time()
    cli = _cli(str(report_json), "--gate", "control", run_id=run_id)
    assert cli.returncode == 0, cli.stderr[-2000:]
    out = cli.stdout.splitlines()
    assert out[0].startswith(f"control step {control['step']} ({control['kind']}, image {built.image_id}, ")
    assert out[0].endswith(f": DIFFERS at {control['count']} position(s)"), out
    assert out[-1] == "control: the recorded difference reproduces exactly (expected: the arms differ)"
    assert _removed(docker_client, run_id, since) == ["replay"]
