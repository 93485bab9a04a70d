"""Checkpoint mode: the recipe saves its actor weights every step (its own options, named in the pins);
the gates compare per-tensor digests of the initial weights and of each step's save.

settings["checkpoint"]: overrides (the recipe's save options), dir_key + dir (where it saves; per gate a
fresh subdirectory), layout ("global_step_{step}/actor/huggingface": a step's weights directory), model_path
(the HF model the recipe loads, or None), may_stay (tensor-name patterns allowed not to change in rl_step).
"""
import os
import shutil
from typing import Any

from acceptance import weights as w

INITIAL = "initial"


def gate_dir(settings: dict[str, Any], gate: str) -> str:
    return os.path.join(settings["checkpoint"]["dir"], gate)


def overrides(settings: dict[str, Any], gate: str) -> dict[str, Any]:
    """The recipe's own checkpoint overrides plus its save directory (a fresh one per gate)."""
    ckpt = settings["checkpoint"]
    return {**ckpt["overrides"], ckpt["dir_key"]: gate_dir(settings, gate)}


def prepare(settings: dict[str, Any], gate: str) -> None:
    """Empty the gate's save directory (a scratch mount may hold an older run's files)."""
    path = gate_dir(settings, gate)
    if os.path.lexists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def _take(label: str, directory: str | None) -> dict[str, Any]:
    if directory is None:
        return {"label": label, "snapshot": None, "error": "no directory"}
    try:
        return {"label": label, "snapshot": w.snapshot(directory), "error": None}
    except w.Unreadable as err:
        return {"label": label, "snapshot": None, "error": str(err)}


def initial(settings: dict[str, Any]) -> dict[str, Any]:
    """The weights the recipe starts from, when its model path is an HF-format directory."""
    path = settings["checkpoint"].get("model_path")
    if not path:
        return {"label": INITIAL, "snapshot": None, "error": "the recipe names no model path"}
    if not os.path.isdir(path):
        return {"label": INITIAL, "snapshot": None, "error": f"model path {path} is not a directory (not HF format)"}
    return _take(INITIAL, path)


def steps(settings: dict[str, Any], gate: str, n_steps: int) -> list[dict[str, Any]]:
    layout = settings["checkpoint"]["layout"]
    return [_take(f"step {s}", os.path.join(gate_dir(settings, gate), layout.format(step=s)))
            for s in range(1, n_steps + 1)]


def _evidence(shots: list[dict[str, Any]]) -> dict[str, Any]:
    return {"mode": "checkpoint",
            "snapshots": [{"label": s["label"], **(w.summary(s["snapshot"]) if s["snapshot"] else {}),
                           **({"error": s["error"]} if s["error"] else {})} for s in shots]}


def _names_differ(a: dict[str, Any], b: dict[str, Any], diff: dict[str, Any]) -> str | None:
    if diff["only_before"] or diff["only_after"]:
        return (f"tensor names differ between {a['label']} and {b['label']}: only in {a['label']} "
                f"{diff['only_before'][:3]}, only in {b['label']} {diff['only_after'][:3]}")
    return None


def _first_differences(a: dict[str, Any], b: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
    out = []
    for name in names[:w.FIRST]:
        try:
            value = w.max_abs_diff(a["snapshot"], b["snapshot"], name)
        except Exception as err:  # noqa: BLE001 - the digest already differs; the diff is detail
            value = f"not computed: {err.__class__.__name__}: {err}"
        t = b["snapshot"]["tensors"][name]
        out.append({"tensor": name, "dtype": t["dtype"], "shape": t["shape"], "max_abs_diff": value})
    return out


def zero_update(shots: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    """pass only when the initial weights and every step's weights are identical, tensor by tensor."""
    evidence = _evidence(shots)
    bad = [s for s in shots[1:] if s["snapshot"] is None]
    if bad:
        return "fail", f"{bad[0]['label']} checkpoint unreadable or missing: {bad[0]['error']}", evidence
    if shots[0]["snapshot"] is None:
        prev = shots[1]
        for cur in shots[2:]:
            diff = w.compare(prev["snapshot"], cur["snapshot"])
            if diff["changed"] or _names_differ(prev, cur, diff):
                evidence["first_differences"] = _first_differences(prev, cur, diff["changed"])
                return ("fail", f"actor weights changed with lr 0 between {prev['label']} and {cur['label']}: "
                        f"{len(diff['changed'])} tensor(s), first {diff['changed'][:3]}", evidence)
        return ("inconclusive", f"initial weights not hashed ({shots[0]['error']}); steps agree, but no "
                "evidence that step 1 left the starting weights unchanged", evidence)
    for prev, cur in zip(shots, shots[1:]):
        diff = w.compare(prev["snapshot"], cur["snapshot"])
        names = _names_differ(prev, cur, diff)
        if names:
            return "fail", names, evidence
        if diff["changed"]:
            evidence["first_differences"] = _first_differences(prev, cur, diff["changed"])
            return ("fail", f"actor weights changed with lr 0 between {prev['label']} and {cur['label']}: "
                    f"{len(diff['changed'])} of {len(diff['changed']) + len(diff['unchanged'])} tensors, "
                    f"first {diff['changed'][:3]}", evidence)
    digest = shots[0]["snapshot"]["digest"]
    return "pass", f"initial and step 1..{len(shots) - 1} weights identical (digest {digest[:16]})", evidence


def rl_step(shots: list[dict[str, Any]], may_stay: list[str]) -> tuple[str, str, dict[str, Any]]:
    """pass only when the weights change at every step and every tensor changes during the run
    (except names matching may_stay): one tensor the optimizer skips is named."""
    evidence = _evidence(shots)
    evidence["may_stay"] = list(may_stay)
    bad = [s for s in shots[1:] if s["snapshot"] is None]
    if bad:
        return "fail", f"{bad[0]['label']} checkpoint unreadable or missing: {bad[0]['error']}", evidence
    known = [s for s in shots if s["snapshot"] is not None]
    changes: list[dict[str, Any]] = []
    moved: set[str] = set()
    evidence["changes"] = changes
    for prev, cur in zip(known, known[1:]):
        diff = w.compare(prev["snapshot"], cur["snapshot"])
        names = _names_differ(prev, cur, diff)
        if names:
            return "fail", names, evidence
        changes.append({"from": prev["label"], "to": cur["label"], "changed": len(diff["changed"]),
                        "unchanged": len(diff["unchanged"]), "first_unchanged": diff["unchanged"][:w.FIRST]})
        if not diff["changed"]:
            return "fail", f"weights did not change from {prev['label']} to {cur['label']} with lr > 0", evidence
        moved.update(diff["changed"])
    stayed = [n for n in sorted(known[0]["snapshot"]["tensors"])
              if n not in moved and not w.allowed_to_stay(n, may_stay)]
    if stayed:
        last = known[-1]["snapshot"]["tensors"]
        evidence["unchanged_tensors"] = [{"tensor": n, "max_abs_diff": 0.0, "sha256": last[n]["sha256"]}
                                         for n in stayed[:w.FIRST]]
        return ("fail", f"{len(stayed)} tensor(s) never changed from {known[0]['label']} to {known[-1]['label']} "
                f"with lr > 0 (skipped by the optimizer?): {stayed[:3]}", evidence)
    if shots[0]["snapshot"] is None:
        return ("inconclusive", f"initial weights not hashed ({shots[0]['error']}): the step-1 update is not "
                "shown", evidence)
    return "pass", f"weights changed at each of steps 1..{len(shots) - 1}, every tensor at least once", evidence
