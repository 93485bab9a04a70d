"""Host side of acceptance: the gate loop over a GateRunner (builder/accept/runner.py: one fresh container
per gate, wherever it runs), the performance gate's interleaved repeats, and the Docker convenience
`accept` / `accept_staged`. The loop never learns which runner ran the gates."""
from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from acceptance import perf as perf_rule
from builder.accept.docker_runner import LABEL, TMPFS, DockerRunner, leftover_containers
from builder.accept.runner import GateRunner
from builder.core import log
from builder.core.constants import CACHE_DIR as CACHE
from builder.core.constants import GATES, MANIFEST
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import AcceptanceResult, EngineFacts, GateResult
from builder.engine import client as engine
from builder.engine import staging
from builder.pins.model import TIMEOUT_S, Pins, check_mounts

__all__ = ["LABEL", "TMPFS", "DockerRunner", "leftover_containers", "accept", "accept_with", "accept_staged"]


def gate_settings(pins: Pins, gate: str) -> dict[str, Any]:
    """What the in-image runner needs: the recipe, its arms, the steps/lr keys and the metric names."""
    acc, recipe = pins.acceptance, pins.recipe
    return {"gate": gate, "entry": list(recipe.entry), "overrides": dict(recipe.overrides), "env": dict(recipe.env),
            "aligned_env": dict(recipe.aligned_env), "control_env": dict(recipe.control_env),
            "steps": acc.steps, "steps_key": acc.steps_key, "lr_key": acc.lr_key, "lr": pins.rl_lr(),
            "logger_key": "trainer.logger", "logger": ["console", "file"],
            "metrics": acc.metrics.model_dump(), "cache_dir": CACHE, "work_dir": "/tmp/acceptance",
            "manifest": MANIFEST, "weights": acc.weights, "checkpoint": checkpoint_settings(pins),
            "performance": acc.performance.model_dump() if acc.performance else None}


def checkpoint_settings(pins: Pins) -> dict[str, Any] | None:
    """Checkpoint mode: the recipe's save options, where it saves, the step layout and the model it loads."""
    ckpt = pins.acceptance.checkpoint
    if pins.acceptance.weights != "checkpoint" or ckpt is None:
        return None
    model_path = pins.recipe.overrides.get(ckpt.model_path_key) if ckpt.model_path_key else None
    return {"overrides": dict(ckpt.overrides), "dir_key": ckpt.dir_key, "dir": ckpt.dir, "layout": ckpt.layout,
            "model_path": str(model_path) if model_path is not None else None, "may_stay": list(ckpt.may_stay)}


def run_performance(runner: GateRunner, pins: Pins, timeout_s: int) -> tuple[GateResult, dict[str, Any]]:
    """The performance gate: `repeats` runs of each arm, interleaved (aligned, control, aligned, ...), each in
    a fresh container; a run that fails fails the gate, otherwise acceptance.perf decides on the medians."""
    perf = pins.acceptance.performance
    if perf is None:
        return GateResult(name="performance", status="not_run", reason="no acceptance.performance in the pins"), {}
    metric = pins.acceptance.performance_metric()
    runs: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"runs": []}
    for index in range(1, perf.repeats + 1):
        for arm in ("aligned", "control"):
            settings = {**gate_settings(pins, "performance"), "arm": arm, "steps": perf.steps or pins.acceptance.steps}
            start = time.monotonic()
            result, fact = runner.run("performance", settings, timeout_s)
            seconds = round(time.monotonic() - start, 3)
            runs.append({"run": index, "arm": arm, "status": result.status, "throughput": result.evidence.get(
                "throughput"), "steps": result.evidence.get("throughput_steps"), "seconds": seconds,
                "processes": result.evidence.get("processes")})
            facts["runs"].append({**fact, "arm": arm, "run": index, "seconds": seconds})
            log.info(f"  performance {arm} run {index}: {result.status}: {result.reason}")
            if result.status != "pass":
                failed = {"metric": metric, "runs": runs, "failed_run": result.evidence}
                return GateResult(name="performance",  # a node failure stays inconclusive, never a fail
                                  status="inconclusive" if result.status == "inconclusive" else "fail",
                                  reason=f"{arm} run {index}: {result.reason}", evidence=failed, log=result.log), facts
    status, reason, evidence = perf_rule.decide([r for r in runs if r["arm"] == "aligned"],
                                                [r for r in runs if r["arm"] == "control"],
                                                perf.min_ratio, perf.max_spread, metric)
    evidence.update({"runs": runs, "repeats": perf.repeats, "min_ratio_reason": perf.reason})
    return GateResult(name="performance", status=status, reason=reason, evidence=evidence), facts


def throughput(gates: list[GateResult], metric: str) -> dict[str, Any]:
    """Rollout throughput of the aligned arm and the control arm, and their ratio: the performance gate's
    medians and every run when it ran, else the rl_step and control gates' single runs."""
    by_name = {g.name: g for g in gates}
    perf = by_name.get("performance")
    if perf is not None and isinstance(perf.evidence.get("aligned"), dict):
        ev = perf.evidence
        return {"metric": ev.get("metric", metric), "aligned": ev["aligned"].get("median"),
                "control": (ev.get("control") or {}).get("median"), "ratio": ev.get("ratio"),
                "source": "performance gate: medians", "min_ratio": ev.get("min_ratio"),
                "max_spread": ev.get("max_spread"), "runs": ev.get("runs") or []}
    aligned = by_name["rl_step"].evidence.get("throughput") if "rl_step" in by_name else None
    control = by_name["control"].evidence.get("throughput") if "control" in by_name else None
    numbers = all(isinstance(v, (int, float)) for v in (aligned, control))
    ratio = aligned / control if numbers and control else None
    return {"metric": metric, "aligned": aligned, "control": control, "ratio": ratio}


def check_selection(gates: Sequence[str] | None, timeout_s: int | None) -> list[str]:
    """The selected gates (default all of GATES); BadInput for an unknown gate or a timeout out of range."""
    selected = list(gates) if gates else list(GATES)
    unknown = [g for g in selected if g not in GATES]
    if unknown:
        raise BadInput(f"--gate: expected one of {', '.join(GATES)}, got {unknown[0]!r}")
    if timeout_s is not None and not TIMEOUT_S[0] <= timeout_s <= TIMEOUT_S[1]:
        raise BadInput(f"--timeout: expected seconds in {TIMEOUT_S[0]}..{TIMEOUT_S[1]}, got {timeout_s!r}")
    return selected


def default_gates(pins: Pins, gates: Sequence[str] | None) -> list[str]:
    """The gates asked for (`--gate`), else the pins' required gates: a gate the pins do not require costs the
    cluster its GPUs and decides nothing, so it runs only when asked for."""
    return list(gates) if gates else [g for g in GATES if g in pins.acceptance.required_gates]


def accept_with(runner: GateRunner, image_id: str, pins: Pins, gates: Sequence[str] | None = None,
                timeout_s: int | None = None, run_id: str = "") -> AcceptanceResult:
    """Run the selected gates (default: the pins' required gates) through `runner`, each in a fresh container;
    the others are not_run. The runner is closed at the end, also on error or interrupt."""
    selected = check_selection(default_gates(pins, gates), timeout_s)
    why = "not selected" if gates else "not in acceptance.required_gates (ask with --gate)"
    timeout = timeout_s or pins.acceptance.timeout_s
    results: list[GateResult] = []
    facts: dict[str, dict[str, Any]] = {}
    try:
        for gate in GATES:
            if gate not in selected:
                results.append(GateResult(name=gate, status="not_run", reason=why))
                continue
            with log.step(f"gate {gate}"):
                start = time.monotonic()
                if gate == "performance":
                    result, facts[gate] = run_performance(runner, pins, timeout)
                else:
                    result, facts[gate] = runner.run(gate, gate_settings(pins, gate), timeout)
                facts[gate]["seconds"] = round(time.monotonic() - start, 3)
            log.info(f"  {gate}: {result.status}: {result.reason}")
            results.append(result)
    finally:
        runner.close()
    where = runner.describe()
    prov = next((g for g in results if g.name == "provenance" and g.status != "not_run"), None)
    environment: dict[str, Any] = {"runner": runner.kind, "engine": where.get("engine")}
    if prov is not None:
        environment.update({"interpreter": prov.evidence.get("interpreter"),
                            "numeric_env": prov.evidence.get("environment"), "gpu": prov.evidence.get("gpu")})
    container = {**where, "image_id": image_id, "run_id": run_id,
                 "mounts": [m.model_dump() for m in pins.acceptance.mounts], "gpus": pins.acceptance.gpus,
                 "timeout_s": timeout, "gates": facts, "weights": pins.acceptance.weights,
                 "checkpoint": checkpoint_settings(pins)}
    return AcceptanceResult(image_id=image_id, container=container, gates=results, environment=environment,
                            throughput=throughput(results, pins.acceptance.metrics.throughput))


def accept(image_id: str, pins: Pins, settings: Settings, gates: Sequence[str] | None = None,
           timeout_s: int | None = None, run_id: str | None = None) -> AcceptanceResult:
    """Run the selected gates (default: the pins' required gates) in fresh containers on the settings' Docker engine.
    Every container carries the label io.truepolicy.acceptance=<run_id> (random unless given)."""
    check_selection(gates, timeout_s)
    client = engine.connect(settings)
    check_mounts(pins, engine.facts(client).get("data_root"))  # the engine's own data root, wherever it is
    full_id = engine.image_id(client, image_id)
    if full_id is None:
        raise BadInput(f"image {image_id}: not found in the Docker engine")
    run_id = run_id or uuid.uuid4().hex[:12]
    return accept_with(DockerRunner(client, pins, full_id, run_id), full_id, pins, gates, timeout_s, run_id)


def accept_staged(ref: str, pins: Any, expected_id: str | None, engine_url: str | None, gates: list[str] | None,
                  timeout_s: int | None, settings: Settings) -> AcceptanceResult:
    """Acceptance on exactly the bytes the registry serves: connect to the engine (default: DOCKER_HOST),
    pull by digest, check the image ID, run the gates there; the engine's facts go into `pulled`."""
    there = replace(settings, docker_host=engine_url) if engine_url else settings
    client = engine.connect(there)  # InfraError (exit 3) first
    who = engine.facts(client)
    pulled = staging.pull(client, ref, expected_id, there)
    log.info(f"acceptance engine {who['host']} ({who['id']}, Docker {who['version']}, gpus {who['gpus']})")
    result = accept(pulled.image_id, pins, there, gates=gates, timeout_s=timeout_s)
    result.pulled = pulled.model_copy(update={"engine": EngineFacts(**who, url=engine_url or "DOCKER_HOST")})
    return result


def gate_runs(pins: Pins, gates: Sequence[str] | None) -> int:
    """How many containers the selected gates start (performance: 2 x repeats)."""
    selected = default_gates(pins, gates)
    perf = pins.acceptance.performance
    return sum(2 * perf.repeats if g == "performance" and perf else 1 for g in selected)

