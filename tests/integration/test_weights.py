"""Checkpoint weight evidence (acceptance/weights.py, acceptance/checkpoint.py) on real files: safetensors
written by the safetensors library, torch checkpoints written by torch.save."""
import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from acceptance import checkpoint, decide, weights

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # torch


class _Torch:
    """torch at first use, not at collection: every xdist worker collects this file, one runs it (~2 s each)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # what collection asks of every module attribute
            raise AttributeError(name)
        import torch as module  # lazy: start-up of every xdist worker

        return getattr(module, name)


torch: Any = _Torch()


def _state(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"model.embed.weight": torch.randn(32, 16, generator=g),
            "model.layers.0.mlp.weight": torch.randn(16, 64, generator=g).to(torch.bfloat16),
            "model.norm.weight": torch.ones(16),
            "lm_head.weight": torch.randn(16, 32, generator=g),
            "step_count": torch.tensor([3], dtype=torch.int64)}


def _changed(state: dict[str, Any], name: str, delta: float = 0.25) -> dict[str, Any]:
    out = {k: v.clone() for k, v in state.items()}
    out[name][1, 2] += delta
    return out


def _write(directory: Path, state: dict[str, Any], fmt: str, shards: int = 1) -> str:
    directory.mkdir(parents=True)
    names = sorted(state)
    for i in range(shards):
        part = {n: state[n].contiguous() for n in names[i::shards]}
        if fmt == "safetensors":
            from safetensors.torch import save_file  # lazy: imports torch

            save_file(part, str(directory / f"model-{i:05d}-of-{shards:05d}.safetensors"), metadata={"step": str(i)})
        else:
            torch.save(part, directory / f"pytorch_model-{i:05d}.bin")
    return str(directory)


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_one_changed_tensor_is_named_with_its_max_abs_diff(tmp_path: Path, fmt: str) -> None:
    a = weights.snapshot(_write(tmp_path / "a", _state(), fmt))
    b = weights.snapshot(_write(tmp_path / "b", _changed(_state(), "model.layers.0.mlp.weight"), fmt, shards=2))
    diff = weights.compare(a, b)
    assert diff["changed"] == ["model.layers.0.mlp.weight"]
    assert diff["only_before"] == diff["only_after"] == [] and len(diff["unchanged"]) == 4
    assert a["digest"] != b["digest"]
    assert weights.max_abs_diff(a, b, "model.layers.0.mlp.weight") == pytest.approx(0.25, abs=0.02)
    entry = a["tensors"]["model.layers.0.mlp.weight"]
    assert entry["dtype"] == "BF16" and entry["shape"] == [16, 64]
    raw = _state()["model.layers.0.mlp.weight"].view(torch.int16).flatten().tolist()  # the bf16 bit patterns
    assert entry["sha256"] == hashlib.sha256(b"".join(v.to_bytes(2, "little", signed=True) for v in raw)).hexdigest()


def test_digest_ignores_file_layout_and_format(tmp_path: Path) -> None:
    """Same tensors -> same digest whatever the shard split, format or file metadata."""
    one = weights.snapshot(_write(tmp_path / "st1", _state(), "safetensors"))
    three = weights.snapshot(_write(tmp_path / "st3", _state(), "safetensors", shards=3))
    torch_one = weights.snapshot(_write(tmp_path / "pt", _state(), "torch", shards=2))
    assert one["digest"] == three["digest"] == torch_one["digest"]


def test_unreadable_and_missing_checkpoints_fail(tmp_path: Path) -> None:
    good = {"label": "initial", "snapshot": weights.snapshot(_write(tmp_path / "a", _state(), "safetensors")),
            "error": None}
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"\xff" * 12)
    (tmp_path / "pt").mkdir()
    (tmp_path / "pt" / "pytorch_model.bin").write_bytes(b"not a zip")
    shots = [good, checkpoint._take("step 1", str(tmp_path / "bad")),
             checkpoint._take("step 2", str(tmp_path / "none"))]
    status, reason, _ = checkpoint.zero_update(shots)
    assert status == "fail" and reason.startswith("step 1 checkpoint unreadable")
    (tmp_path / "hdr").mkdir()
    (tmp_path / "hdr" / "model.safetensors").write_bytes(len(b'{"w": {"dtype": "F32"}}').to_bytes(8, "little")
                                                       + b'{"w": {"dtype": "F32"}}')
    assert "malformed" in checkpoint._take("step 1", str(tmp_path / "hdr"))["error"]
    shots[1] = checkpoint._take("step 1", str(tmp_path / "pt"))
    assert "torch.load failed" in shots[1]["error"]
    assert checkpoint.rl_step(shots, [])[0] == "fail"
    shots[1] = good | {"label": "step 1"}
    status, reason, _ = checkpoint.zero_update(shots)
    assert status == "fail" and "step 2" in reason and "no such directory" in reason


def _shots(tmp_path: Path, states: list[dict[str, Any]], fmt: str = "safetensors") -> list[dict[str, Any]]:
    labels = ["initial"] + [f"step {i}" for i in range(1, len(states))]
    return [{"label": label, "error": None,
             "snapshot": weights.snapshot(_write(tmp_path / label.replace(" ", ""), s, fmt))}
            for label, s in zip(labels, states)]


def test_zero_update_passes_only_when_all_snapshots_are_identical(tmp_path: Path) -> None:
    same = _shots(tmp_path / "same", [_state(), _state(), _state()])
    status, reason, evidence = checkpoint.zero_update(same)
    assert status == "pass", reason
    assert [s["digest"] for s in evidence["snapshots"]] == [same[0]["snapshot"]["digest"]] * 3
    moved = _shots(tmp_path / "moved", [_state(), _state(), _changed(_state(), "lm_head.weight", 1e-3)], "torch")
    status, reason, evidence = checkpoint.zero_update(moved)
    assert status == "fail" and "between step 1 and step 2" in reason and "lm_head.weight" in reason
    assert evidence["first_differences"][0]["tensor"] == "lm_head.weight"
    assert evidence["first_differences"][0]["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    no_initial = [{"label": "initial", "snapshot": None, "error": "the recipe names no model path"}] + same[1:]
    assert checkpoint.zero_update(no_initial)[0] == "inconclusive"


def test_rl_step_needs_a_change_at_every_step_and_every_tensor_to_move(tmp_path: Path) -> None:
    def step(state: dict[str, Any], k: int) -> dict[str, Any]:
        return {n: (t + 0.01 * k if t.dtype != torch.int64 else t + k) for n, t in state.items()}

    s0 = _state()
    good = _shots(tmp_path / "good", [s0, step(s0, 1), step(s0, 2)])
    assert checkpoint.rl_step(good, [])[0] == "pass"
    frozen = [s0, step(s0, 1), step(s0, 2)]
    for s in frozen[1:]:
        s["model.norm.weight"] = s0["model.norm.weight"].clone()
    shots = _shots(tmp_path / "frozen", frozen)
    status, reason, evidence = checkpoint.rl_step(shots, [])
    assert status == "fail" and "model.norm.weight" in reason
    assert evidence["unchanged_tensors"][0]["tensor"] == "model.norm.weight"
    assert checkpoint.rl_step(shots, ["model.norm.*"])[0] == "pass"
    stuck = _shots(tmp_path / "stuck", [s0, step(s0, 1), step(s0, 1)])
    status, reason, _ = checkpoint.rl_step(stuck, [])
    assert status == "fail" and reason == "weights did not change from step 1 to step 2 with lr > 0"


def test_decide_uses_checkpoint_evidence_and_none_is_inconclusive(tmp_path: Path) -> None:
    run = decide.Run(exit_code=0, steps={s: {"training/rollout_probs_diff_max": 0.0, "rollout_corr/k3_kl": 0.0,
                                             "critic/rewards/mean": 0.5, "actor/pg_loss": 0.1} for s in (1, 2)})
    from acceptance.defaults import METRICS as DEFAULT_METRICS

    shots = _shots(tmp_path, [_state(), _state(), _changed(_state(), "model.embed.weight")])
    status, reason, evidence = decide.zero_update(run, 2, DEFAULT_METRICS, {"mode": "checkpoint", "shots": shots})
    assert status == "fail" and "model.embed.weight" in reason and evidence["weights"]["mode"] == "checkpoint"
    assert decide.zero_update(run, 2, DEFAULT_METRICS, {"mode": "none"})[0] == "inconclusive"
    assert decide.rl_step(run, 2, DEFAULT_METRICS, {"mode": "none"})[0] == "inconclusive"


def test_suite_imports_no_torch_at_import_time() -> None:
    code = ("import sys, acceptance.__main__, acceptance.checkpoint, acceptance.weights, acceptance.decide; "
            "print('torch' in sys.modules, 'safetensors' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
