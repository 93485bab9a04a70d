"""Checkpoint mode (acceptance.weights: checkpoint) against REAL demo images: the recipe saves its actor weights
with verl's options, the checksum metrics are switched off in the demo loop, and the gates decide on
per-tensor digests of the initial weights and each step's save."""
import json
from pathlib import Path

import docker
import pytest

from builder.core.constants import GATES
from builder.core.options import Settings
from builder.core.records import AcceptanceResult, GateResult
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.pins.model import Pins
from builder.report import document as report
from builder.runners import factory as runners
from tests.defects import without_performance
from tests.fixture_types import BuildVariant, DemoImage, DockerClient

pytestmark = pytest.mark.docker

SETTINGS = Settings.from_env()
MODEL = "/models/tinyrl-seed-1"
CHECKSUMS = ("weights_before", "weights_after")


@pytest.fixture(scope="session")
def model_dir(demo_image: DemoImage, docker_client: DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HF-style initial model the recipe loads, written by the demo image itself (network none)."""
    out = tmp_path_factory.mktemp("tinyrl-model")
    built = demo_image[3]
    docker_client.containers.run(
        built.image_id, [demo_image[0].base.python_bin, "-m", "tinyrl.init_model", "/out/seed-1", "1"],
        network_mode="none", remove=True,
        mounts=[docker.types.Mount(target="/out", source=str(out), type="bind", read_only=False)])
    return out / "seed-1"


def checkpoint_pins(pins: Pins, model_dir: Path, scratch: Path | None = None, model: str = MODEL,
                    scratch_dir: str = "/scratch/checkpoints") -> Pins:
    """The demo pins in checkpoint mode: verl's save options from the pins, the demo loop's checksum
    metrics off, the initial model mounted read-only at `model`, where the recipe's model path points; with
    `scratch`, the saves on that host directory mounted at `scratch_dir`."""
    data = pins.to_json_dict()
    data["recipe"]["overrides"].update({"actor_rollout_ref.model.path": model,
                                        "actor_rollout_ref.actor.weight_checksums": False})
    acc = data["acceptance"]
    acc["weights"] = "checkpoint"
    acc["checkpoint"] = {"overrides": {"trainer.save_freq": 1,
                                       "actor_rollout_ref.actor.checkpoint.save_contents": ["hf_model"]},
                         "dir_key": "trainer.default_local_dir", "layout": "global_step_{step}/actor/huggingface",
                         "model_path_key": "actor_rollout_ref.model.path"}
    if scratch is not None:
        acc["checkpoint"].update({"scratch": str(scratch), "dir": scratch_dir})
    acc["mounts"] = [{"source": str(model_dir), "target": model}]
    without_performance(data)  # these tests are about weights read from checkpoints, not about speed
    return pins_mod.validate(data, pins.directory)


def _gates(result: AcceptanceResult) -> dict[str, GateResult]:
    return {g.name: g for g in result.gates}


def _show(*gates: GateResult) -> None:
    """The weight evidence, for `pytest -s` readers."""
    print(json.dumps({g.name: {"status": g.status, "reason": g.reason, "weights": g.evidence.get("weights")}
                      for g in gates}, indent=1))


def test_checkpoint_mode_accepts_the_clean_demo_without_checksum_metrics(demo_image: DemoImage, model_dir: Path,
                                                                         docker_client: DockerClient,
                                                                          run_id: str) -> None:
    pins, resolved, _, built = demo_image
    ckpt = checkpoint_pins(pins, model_dir)
    result = runners.gate_local_image(built.image_id, ckpt, SETTINGS, run_id=run_id)
    gates = _gates(result)
    exact = [g for g in GATES if g != "performance"]  # checkpoint_pins drops the speed gate
    assert {n: g.status for n, g in gates.items() if n in exact} == {n: "pass" for n in exact}, \
        {n: g.reason for n, g in gates.items()}
    assert gates["performance"].status == "not_run"
    assert report.make_report(ckpt, lock_record.of(pins), resolved, built, result).verdict == "ACCEPTED"
    for name in ("zero_update", "rl_step"):
        ev = gates[name].evidence.model_dump(mode="json")
        assert all(role not in step for step in ev["steps"].values() for role in CHECKSUMS)  # not in the log
        argv = ev["run"]["argv"]
        assert "trainer.save_freq=1" in argv and "actor_rollout_ref.actor.weight_checksums=false" in argv
        assert f"trainer.default_local_dir=/tmp/acceptance/checkpoints/{name}" in argv
        shots = ev["weights"]["snapshots"]
        assert [s["label"] for s in shots] == ["initial", "step 1", "step 2"] and all(s["tensors"] == 20 for s in shots)
    zero = [s["digest"] for s in gates["zero_update"].evidence.model_dump(mode="json")["weights"]["snapshots"]]
    assert len(set(zero)) == 1
    moved = [s["digest"] for s in gates["rl_step"].evidence.model_dump(mode="json")["weights"]["snapshots"]]
    assert moved[0] == zero[0] and len(set(moved)) == 3
    _show(gates["zero_update"], gates["rl_step"])


def test_weight_decay_at_lr_zero_fails_zero_update_on_checkpoints_alone(demo_image: DemoImage, build_variant: BuildVariant,
                                                                        model_dir: Path,
                                                                         docker_client: DockerClient, run_id: str) -> None:
    ckpt = checkpoint_pins(demo_image[0], model_dir)
    result = runners.gate_local_image(build_variant("megatron", 23).image_id, ckpt, SETTINGS, gates=["zero_update"],
                                      run_id=run_id)
    gate = _gates(result)["zero_update"]
    assert gate.status == "fail", gate.reason
    assert gate.reason.startswith("actor weights changed with lr 0 between initial and step 1")
    assert all(role not in step for step in (gate.evidence.steps or {}).values() for role in CHECKSUMS)
    first = gate.evidence.model_dump(mode="json")["weights"]["first_differences"]
    assert first and all(d["max_abs_diff"] > 0 for d in first)
    _show(gate)


def test_one_tensor_skipped_by_the_optimizer_fails_rl_step(demo_image: DemoImage, build_variant: BuildVariant, model_dir: Path,
                                                           docker_client: DockerClient,
                                                            run_id: str, tmp_path: Path) -> None:
    """#24 also runs with the checkpoints on a scratch mount the pins name (read-write, only there)."""
    ckpt = checkpoint_pins(demo_image[0], model_dir, scratch=tmp_path)
    result = runners.gate_local_image(build_variant("megatron", 24).image_id, ckpt, SETTINGS, gates=["zero_update", "rl_step"],
                                      run_id=run_id)
    gates = _gates(result)
    assert gates["zero_update"].status == "pass", gates["zero_update"].reason
    gate = gates["rl_step"]
    assert gate.status == "fail" and "lm_head.weight" in gate.reason, gate.reason
    assert gate.evidence.model_dump(mode="json")["weights"]["unchanged_tensors"][0]["tensor"] == "lm_head.weight"
    assert [c["changed"] for c in gate.evidence.model_dump(mode="json")["weights"]["changes"]] == [19, 19]
    mounts = result.where.gates["rl_step"].get("mounts") or []
    assert {(m["target"], m["rw"]) for m in mounts} == {(MODEL, False), ("/scratch/checkpoints", True),
                                                         ("/census", False)}  # and the census volume, read-only
    assert (tmp_path / "rl_step" / "global_step_2" / "actor" / "huggingface" / "pytorch_model.bin").is_file()
    _show(gate)
