"""Gate decisions from a parsed run: pure functions, so they are unit-tested on real log text.

Every decision returns (status, reason, evidence). A missing step, a missing metric, a NaN or a
non-zero exit is never a pass.
"""
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from acceptance import checkpoint
from acceptance.metrics import disagreements, first_nonfinite, is_finite, number

ZERO_KEYS = ("diff_max", "k3_kl")

Verdict = tuple[str, str, dict[str, Any]]   # (status, reason, evidence)
Sums = list[tuple[Any, Any]]                # (before, after) weight checksums per step


@dataclass
class Run:
    exit_code: int | None
    steps: dict[int, dict[str, Any]]    # {step: metrics}, from the file log (else the console)
    source: str = "file"                # file | console | none
    console: dict[int, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)   # unparsable JSONL lines
    error: str | None = None            # the recipe's last error line when it exited non-zero


def _table(run: Run, n_steps: int, metrics: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per-step values of the metrics named in the settings (evidence)."""
    return {str(step): {role: run.steps[step][name] for role, name in metrics.items()
                        if name in run.steps.get(step, {})}
            for step in range(1, n_steps + 1)}


def _basic(run: Run, n_steps: int) -> str | None:
    """Reason to fail before looking at values: exit status, empty or incomplete log."""
    if run.exit_code != 0:
        return f"recipe exited with status {run.exit_code}" + crash_cause(run)
    if not run.steps:
        return "no step metrics in the file log or the console"
    missing = [s for s in range(1, n_steps + 1) if s not in run.steps]
    if missing:
        return f"step(s) {missing} missing from the {run.source} log (expected 1..{n_steps})"
    return None


def crash_cause(run: Run) -> str:
    """What a crashed run shows: the first non-finite metric it logged (step and key) and its last error line."""
    parts = []
    nonfinite = first_nonfinite(run.steps) or first_nonfinite(run.console)
    if nonfinite:
        parts.append(f"first non-finite metrics at {nonfinite}")
    if run.error:
        parts.append(f"last error: {run.error}")
    return "; " + "; ".join(parts) if parts else ""


def _exact_zero(run: Run, n_steps: int, metrics: dict[str, str]) -> str | None:
    """Reason to fail unless diff_max and k3_kl (and diff_mean where logged) are exactly 0.0 at every step."""
    for step in range(1, n_steps + 1):
        data = run.steps[step]
        roles = list(ZERO_KEYS) + (["diff_mean"] if metrics.get("diff_mean") in data else [])
        for role in roles:
            name = metrics[role]
            if name not in data:
                return f"step {step}: metric {name} missing"
            value = number(data[name])
            if value is None or math.isnan(value):
                return f"step {step}: {name} is {data[name]!r}, not a number"
            if value != 0.0:
                return f"step {step}: {name} = {value!r}, expected exactly 0.0"
    names = [metrics[r] for r in (*ZERO_KEYS, "diff_mean") if metrics.get(r)]
    odd = disagreements(run.steps, run.console, names)
    if odd:
        return "file and console logs disagree: " + "; ".join(odd[:3])
    return None


def _checksums(run: Run, n_steps: int, metrics: dict[str, str]) -> Sums | str | None:
    """[(before, after)] per step; None when neither checksum is logged at all; 'partial' when only some are."""
    pairs = [(run.steps[s].get(metrics["weights_before"]), run.steps[s].get(metrics["weights_after"]))
             for s in range(1, n_steps + 1)]
    present = [v is not None for pair in pairs for v in pair]
    if not any(present):
        return None
    if not all(present):
        return "partial"
    return pairs


def _by_weights(decision: Callable[[dict[str, Any]], Verdict], weights: dict[str, Any] | None,
                evidence: dict[str, Any], done: str) -> Verdict | None:
    """Weight verdict from the mode the pins select: 'none' is inconclusive, 'checkpoint' compares saved
    weights (acceptance.checkpoint); None / 'metrics' returns None so the checksum metrics decide."""
    weights = weights or {}
    mode = weights.get("mode", "metrics")
    if mode == "none":
        return "inconclusive", f"{done}, but weight evidence is off (acceptance.weights: none)", evidence
    if mode == "checkpoint":
        status, reason, extra = decision(weights)
        evidence["weights"] = extra
        return status, (f"{done}; {reason}" if status == "pass" else reason), evidence
    return None


def zero_update(run: Run, n_steps: int, metrics: dict[str, str], weights: dict[str, Any] | None = None) -> Verdict:
    evidence: dict[str, Any] = {"exit_code": run.exit_code, "log_source": run.source, "steps": _table(run, n_steps, metrics)}
    reason = _basic(run, n_steps) or _exact_zero(run, n_steps, metrics)
    if reason:
        return "fail", reason, evidence
    done = f"diff and k3 exactly 0 at steps 1..{n_steps}"
    verdict = _by_weights(lambda w: checkpoint.zero_update(w["shots"]), weights, evidence, done)
    if verdict:
        return verdict
    sums = _checksums(run, n_steps, metrics)
    if sums is None:
        return ("inconclusive", f"diff and k3 exactly 0 at steps 1..{n_steps}, but the weight checksums "
                f"({metrics['weights_before']}, {metrics['weights_after']}) are not logged", evidence)
    if isinstance(sums, str):  # "partial"
        return "fail", "weight checksum missing at some step", evidence
    values = {v for pair in sums for v in pair}
    evidence["weights"] = sorted(values)
    if len(values) != 1:
        changed = [i + 1 for i, (b, a) in enumerate(sums) if b != a]
        where = f"at step(s) {changed}" if changed else "between steps"
        return "fail", f"actor weights changed with lr 0 {where} (checksums {sorted(values)})", evidence
    return "pass", f"diff and k3 exactly 0 at steps 1..{n_steps}; weights unchanged with lr 0", evidence


def rl_step(run: Run, n_steps: int, metrics: dict[str, str], weights: dict[str, Any] | None = None) -> Verdict:
    evidence: dict[str, Any] = {"exit_code": run.exit_code, "log_source": run.source, "steps": _table(run, n_steps, metrics)}
    reason = _basic(run, n_steps) or _exact_zero(run, n_steps, metrics)
    if reason:
        return "fail", reason, evidence
    if n_steps < 2:
        return "inconclusive", "one step shows no update and reload; run at least 2 steps", evidence
    for step in range(1, n_steps + 1):
        for role in ("reward", "loss"):
            name = metrics[role]
            value = run.steps[step].get(name)
            if not is_finite(value):
                return "fail", f"step {step}: {name} is {value!r}, expected a finite number", evidence
    evidence["throughput"] = mean_metric(run, n_steps, metrics["throughput"])
    evidence["throughput_steps"] = [run.steps[s].get(metrics["throughput"]) for s in range(1, n_steps + 1)]
    done = f"diff and k3 exactly 0 at steps 1..{n_steps} after an update and reload; reward and loss finite"
    verdict = _by_weights(lambda w: checkpoint.rl_step(w["shots"], w.get("may_stay") or []), weights, evidence, done)
    if verdict:
        return verdict
    sums = _checksums(run, n_steps, metrics)
    if sums is None:
        return ("inconclusive", f"diff and k3 exactly 0 at steps 1..{n_steps}, but the weight checksums are not"
                " logged, so the update and reload are not shown", evidence)
    if isinstance(sums, str):  # "partial"
        return "fail", "weight checksum missing at some step", evidence
    if sums[0][0] == sums[0][1]:
        return "fail", f"weights did not change at step 1 with lr > 0 (checksum {sums[0][0]})", evidence
    return ("pass", f"diff and k3 exactly 0 at steps 1..{n_steps} after a real update and reload "
            f"(weights {sums[0][0]} -> {sums[0][1]}); reward and loss finite", evidence)


def control(run: Run, n_steps: int, metrics: dict[str, str], weights: dict[str, Any] | None = None) -> Verdict:
    evidence: dict[str, Any] = {"exit_code": run.exit_code, "log_source": run.source, "steps": _table(run, n_steps, metrics)}
    reason = _basic(run, n_steps)
    if reason:
        return "fail", reason, evidence
    name = metrics["diff_max"]
    values = []
    for step in range(1, n_steps + 1):
        k3 = number(run.steps[step].get(metrics["k3_kl"]))
        if k3 is None or math.isnan(k3):
            return "fail", f"step {step}: {metrics['k3_kl']} is {run.steps[step].get(metrics['k3_kl'])!r}", evidence
        value = number(run.steps[step].get(name))
        if value is None or math.isnan(value):
            return "fail", f"step {step}: {name} is {run.steps[step].get(name)!r}, not a number", evidence
        values.append(value)
    evidence["diff_max"] = max(values)
    evidence["throughput"] = mean_metric(run, n_steps, metrics["throughput"])
    evidence["throughput_steps"] = [run.steps[s].get(metrics["throughput"]) for s in range(1, n_steps + 1)]
    if max(values) > 0:
        return "pass", f"control arm shows a mismatch ({name} max {max(values)!r}): the gates tell arms apart", evidence
    return ("inconclusive", f"control arm also has {name} exactly 0 at every step: the suite cannot tell "
            "aligned from unaligned here", evidence)


def mean_metric(run: Run, n_steps: int, name: str) -> float | None:
    """Mean of a numeric metric over steps 1..n (None when any step lacks a finite value)."""
    values = [number(run.steps.get(s, {}).get(name)) for s in range(1, n_steps + 1)]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not values or len(finite) != len(values):
        return None
    return sum(finite) / len(finite)


def performance_run(run: Run, n_steps: int, metric: str, arm: str) -> Verdict:
    """One run of the performance gate (one arm, in its own container): the median of its steps' throughput
    (a step stalled by the host, or the first step's warm-up, does not move it). The decision over all runs
    is acceptance.perf.decide, on the host."""
    values = [number(run.steps.get(s, {}).get(metric)) for s in range(1, n_steps + 1)]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    whole = len(finite) == len(values)
    evidence = {"arm": arm, "exit_code": run.exit_code, "log_source": run.source, "metric": metric,
                "throughput": statistics.median(finite) if whole and finite else None,
                "throughput_steps": [run.steps.get(s, {}).get(metric) for s in range(1, n_steps + 1)]}
    reason = _basic(run, n_steps)
    if reason:
        return "fail", reason, evidence
    if evidence["throughput"] is None:
        return "fail", f"{metric} missing or not finite at some step of 1..{n_steps}", evidence
    return "pass", f"{arm} arm: {metric} {evidence['throughput']:.4g} (median of steps 1..{n_steps})", evidence


Decision = Callable[[Run, int, dict[str, str], dict[str, Any] | None], Verdict]
DECISIONS: dict[str, Decision] = {"zero_update": zero_update, "rl_step": rl_step, "control": control}
