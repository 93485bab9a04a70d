"""Replay bundles: the first difference a recipe gate saw, small enough to travel in its GateResult, and the
in-container side of `builder replay` (`python -m acceptance replay --bundle FILE`).

The recipe writes a capture when REPLAY_CAPTURE_DIR is set (the demo's tinyrl: step_<N>.json per step). A
gate picks the first step that differs: rollout and trainer logprobs at some (row, token), or, for
zero_update, weights that the optimizer step moved at lr 0. The bundle keeps that step's batch, the first
differing positions with both sides' values, the weights digest (the weights themselves only when they are
not the run's initial ones and fit in WEIGHTS_MAX), and the recipe's replay entry. Stdlib only."""
import base64
import glob
import json
import os
import subprocess
import sys
from typing import Any

ENV = "REPLAY_CAPTURE_DIR"
FIRST = 16                    # differing positions kept
WEIGHTS_MAX = 1024 * 1024     # bytes of weights carried inline; larger ones travel as their digest only
KINDS = {"zero_update": ("weights", "logprobs"), "rl_step": ("logprobs",), "control": ("logprobs",)}


def steps(capture_dir: str) -> list[dict[str, Any]]:
    found = []
    for path in glob.glob(os.path.join(capture_dir, "step_*.json")):
        try:
            with open(path) as fh:
                found.append(json.load(fh))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda s: int(s.get("step", 0)))


def logprob_diffs(step: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """Positions (row, token) where trainer and rollout logprobs are not the same float (NaN never is)."""
    count, first = 0, list[dict[str, Any]]()
    for r, (trainer, rollout) in enumerate(zip(step["trainer_logprobs"], step["rollout_logprobs"])):
        for t, (a, b) in enumerate(zip(trainer, rollout)):
            if not a == b:
                count += 1
                if len(first) < FIRST:
                    first.append({"position": [r, t], "trainer": a, "rollout": b})
    return count, first


def _weights(capture_dir: str, step: dict[str, Any]) -> dict[str, Any]:
    digest = step["weights_before"]
    if digest == step.get("initial_weights"):
        return {"digest": digest, "source": "initial (the recipe's seeded start)"}
    path = os.path.join(capture_dir, f"step_{step['step']}.weights")
    size = os.path.getsize(path) if os.path.exists(path) else None
    if size is None or size > WEIGHTS_MAX:
        return {"digest": digest, "source": "digest only" + (f" ({size} bytes > {WEIGHTS_MAX})" if size else "")}
    with open(path, "rb") as fh:
        return {"digest": digest, "source": "inline", "data": base64.b64encode(fh.read()).decode()}


def bundle(gate: str, capture_dir: str, settings: dict[str, Any], arm_env: dict[str, Any], lr: float) -> dict[str, Any] | None:
    """The gate's replay bundle; {"differs": False} when every captured step agrees; None without a capture."""
    captured = steps(capture_dir)
    if not captured:
        return None
    for step in captured:
        for kind in KINDS[gate]:
            if kind == "weights":
                moved = step.get("weights_changed") or {}
                count, first = int(moved.get("count") or 0), list(moved.get("first") or [])
            else:
                count, first = logprob_diffs(step)
            if count:
                return {"schema": 1, "gate": gate, "differs": True, "kind": kind, "step": step["step"],
                        "count": count, "first": first, "lr": lr, "arm_env": dict(arm_env),
                        "recipe_env": dict(settings.get("env") or {}), "python": sys.executable,
                        "batch": {"prompts": step["prompts"], "responses": step["responses"],
                                  "sample_seed": step["sample_seed"], "seed": step.get("seed")},
                        "weights": _weights(capture_dir, step), "config": step.get("config") or {},
                        "replay_entry": step.get("replay_entry")}
    return {"schema": 1, "gate": gate, "differs": False, "steps": [s["step"] for s in captured],
            "note": f"nothing to replay: {gate} saw no difference at captured steps {[s['step'] for s in captured]}"}


def run(bundle_path: str, timeout_s: int = 600) -> dict[str, Any]:
    """Replay a bundle here: its recipe entry on the bundle, with the gate's recipe and arm environment."""
    with open(bundle_path) as fh:
        data = json.load(fh)
    entry = data.get("replay_entry")
    if not data.get("differs"):
        return {"differs": False, "note": data.get("note", "nothing to replay")}
    if not isinstance(entry, list) or not all(isinstance(a, str) for a in entry) or not entry:
        return {"error": "the bundle names no replay entry (the recipe wrote none)"}
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (data.get("recipe_env") or {}).items()})
    env.update({k: str(v) for k, v in (data.get("arm_env") or {}).items()})
    env.pop(ENV, None)
    done = subprocess.run([*entry, bundle_path], capture_output=True, text=True, env=env, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        return {"error": f"replay entry exited {done.returncode} without a result line", "log": done.stderr[-3000:]}
    return result


def main(bundle_path: str) -> int:
    """Print the replay's JSON line; exit 1 while the sides differ, 0 once they agree, 2 if it cannot replay."""
    result = run(bundle_path)
    print(json.dumps(result), flush=True)
    if result.get("error"):
        return 2
    return 1 if result.get("differs") else 0


def as_gate(settings: dict[str, Any]) -> dict[str, Any]:
    """The replay as a gate's result line (`python -m acceptance gate replay`): pass when the sides agree, fail
    while they differ, inconclusive when it cannot replay; the replay's own result is the evidence."""
    import tempfile

    where = settings.get("work_dir") or tempfile.gettempdir()
    os.makedirs(where, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, dir=where) as fh:
        json.dump(settings.get("bundle") or {}, fh)
    try:
        result = run(fh.name, int(settings.get("timeout_s") or 600))
    finally:
        os.unlink(fh.name)
    if result.get("error"):
        status, reason = "inconclusive", f"cannot replay: {result['error']}"
    elif result.get("differs"):
        status, reason = "fail", f"differs at {result.get('count')} position(s)"
    else:
        status, reason = "pass", "equal: no position differs"
    return {"name": "replay", "status": status, "reason": reason, "evidence": result, "log": result.get("log", "")}
