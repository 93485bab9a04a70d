"""Host side of acceptance: the gate loop `run_gates` over a GateRunner (builder/gating/runner.py: one fresh
container per gate, wherever it runs) driven by the acceptance plan (builder/gating/plan.py), and the performance
gate's interleaved repeats. The loop never learns which runner ran the gates (builder/runners/factory.py opens it)."""
from __future__ import annotations

import time
from typing import Any

from acceptance import perf as perf_rule
from builder.core import log
from builder.core.evidence import RunEnvironment, Throughput
from builder.core.records import AcceptanceResult, Evidence, GateResult, Pulled
from builder.gating.plan import AcceptancePlan
from builder.gating.runner import GateRunner
from builder.gating.settings import ARMS, GateCall, GateSettings
from builder.pins.model import Pins


def run_performance(runner: GateRunner, settings: GateSettings, timeout_s: int) -> tuple[GateResult, dict[str, Any]]:
    """The performance gate: pairs of runs (aligned, then control), each in a fresh container, until the sequential
    rule (acceptance.perf) decides, from `min_pairs` on, or `repeats` pairs ran; a run that fails fails the gate."""
    perf = settings.performance
    if perf is None:
        return GateResult(name="performance", status="not_run", reason="no acceptance.performance in the pins"), {}
    metric, rule = perf.metric, perf.rule
    runs: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"runs": []}
    for index in range(1, perf.repeats + 1):
        for arm in ARMS:
            start = time.monotonic()
            result, fact = runner.run(GateCall("performance", settings, arm), timeout_s)
            seconds = round(time.monotonic() - start, 3)
            runs.append({"run": index, "arm": arm, "status": result.status, "throughput": result.evidence.throughput,
                         "steps": result.evidence.throughput_steps, "seconds": seconds,
                         "processes": result.evidence.processes})
            facts["runs"].append({**fact, "arm": arm, "run": index, "seconds": seconds})
            log.info(f"  performance {arm} run {index}: {result.status}: {result.reason}")
            if result.status != "pass":
                failed = {"metric": metric, "runs": runs, "failed_run": result.evidence.as_dict()}
                return GateResult(name="performance",  # a node failure stays inconclusive, never a fail
                                  status="inconclusive" if result.status == "inconclusive" else "fail",
                                  reason=f"{arm} run {index}: {result.reason}",
                                  evidence=Evidence.model_validate(failed), log=result.log), facts
        status, reason, evidence = perf_rule.decide([r for r in runs if r["arm"] == "aligned"],
                                                    [r for r in runs if r["arm"] == "control"], rule, metric)
        if (status != "inconclusive" and index >= rule.min_pairs) or evidence["pairs"] == 0:
            break
        if index < perf.repeats:
            log.info(f"  performance after {index} pair(s): not decided yet, another pair")
    evidence.update({"runs": runs, "repeats": perf.repeats, "min_ratio_reason": perf.reason})
    log.info(f"  performance: {status} after {evidence['pairs']} pair(s) ({evidence['stopped']})")
    return GateResult(name="performance", status=status, reason=reason,
                      evidence=Evidence.model_validate(evidence)), facts


def throughput(gates: list[GateResult], metric: str) -> Throughput:
    """Rollout throughput of the aligned arm and the control arm, and their ratio: the performance gate's
    medians, its pairs' ratio and every run when it ran, else the rl_step and control gates' single runs."""
    by_name = {g.name: g for g in gates}
    perf = by_name.get("performance")
    if perf is not None and perf.evidence.aligned is not None:
        ev = perf.evidence
        return {"metric": ev.metric or metric, "aligned": ev.aligned.median if ev.aligned else None,
                "control": ev.control.median if ev.control else None, "ratio": ev.ratio,
                "source": "performance gate: pairs", "min_ratio": ev.min_ratio, "confidence": ev.confidence,
                "pairs": ev.pairs, "stopped": ev.stopped, "max_spread": ev.max_spread, "runs": ev.runs or []}
    aligned = by_name["rl_step"].evidence.throughput if "rl_step" in by_name else None
    control = by_name["control"].evidence.throughput if "control" in by_name else None
    ratio = aligned / control if aligned is not None and control else None
    return {"metric": metric, "aligned": aligned, "control": control, "ratio": ratio}


def run_gates(runner: GateRunner, image_id: str, plan: AcceptancePlan, pins: Pins,
                pulled: Pulled | None = None) -> AcceptanceResult:
    """Run the plan's gates through `runner`, each in a fresh container with its own limit; the others are
    not_run with the plan's reason. The runner is closed at the end, also on error or interrupt."""
    settings = GateSettings.of(pins)  # once: every gate's settings and the loop's own reads
    results: list[GateResult] = []
    facts: dict[str, dict[str, Any]] = {}
    try:
        for step in plan.gates:
            if not step.run:
                results.append(GateResult(name=step.name, status="not_run", reason=step.why))
                continue
            with log.step(f"gate {step.name}"):
                start = time.monotonic()
                if step.name == "performance":
                    result, facts[step.name] = run_performance(runner, settings, step.timeout_s)
                else:
                    result, facts[step.name] = runner.run(GateCall(step.name, settings), step.timeout_s)
                facts[step.name]["seconds"] = round(time.monotonic() - start, 3)
            log.info(f"  {step.name}: {result.status}: {result.reason}")
            results.append(result)
    finally:
        runner.close()
    where = runner.describe()
    limits = where.limits.model_copy(update={"gate_timeout_s": {g.name: g.timeout_s for g in plan.gates if g.run}})
    prov = next((g for g in results if g.name == "provenance" and g.status != "not_run"), None)
    environment: RunEnvironment = {"runner": where.runner, "engine": where.engine}
    if prov is not None:
        environment.update({"interpreter": prov.evidence.interpreter,
                            "numeric_env": prov.evidence.environment, "gpu": prov.evidence.gpu})
    described = type(where).model_validate({
        **where.model_dump(), "image_id": image_id, "run_id": runner.run_id, "limits": limits.model_dump(),
        "mounts": [m.model_dump() for m in settings.mounts], "gpus": settings.gpus, "gates": facts,
        "weights": settings.weights, "checkpoint": settings.checkpoint.wire() if settings.checkpoint else None})
    return AcceptanceResult(image_id=image_id, where=described, gates=results, environment=environment,
                            throughput=throughput(results, settings.throughput_metric), pulled=pulled)

