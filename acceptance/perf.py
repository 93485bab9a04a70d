"""The performance decision: a sequential test on the ratios of interleaved pairs of runs (stdlib only: it runs in
the image, on the host for the report and in nightly's regression flag).

Pair i is aligned run i and control run i, started one after the other, so both share the load of their moment;
its ratio is aligned_i / control_i. The rule works on the log-ratios: their mean m and standard deviation s (at
least NOISE_FLOOR) give a one-sided Student-t bound at `confidence` on each side of the ratio's geometric mean,
low = exp(m - t * s / sqrt(n)) and high = exp(m + t * s / sqrt(n)). From `min_pairs` pairs on, the gate stops with
pass when low >= min_ratio, with fail when high < min_ratio, and otherwise runs another pair; after `max_pairs`
the result is inconclusive, naming the arms' spreads (the machine's load), never a fail. Both bounds narrow as
pairs are added, so a clear answer stops early and a loaded machine costs more pairs rather than a wrong verdict.
A run whose throughput is missing fails."""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from acceptance.metrics import number

Status = Literal["pass", "fail", "inconclusive"]
NOISE_FLOOR = 0.02  # the least standard deviation of the log-ratios: two equal pairs are not proof of no noise


@dataclass(frozen=True)
class Rule:
    """The gate's settings (the pins' acceptance.performance): the threshold, the confidence of each bound and the
    least and most pairs to run."""
    min_ratio: float
    confidence: float = 0.95
    min_pairs: int = 2
    max_pairs: int = 3
    max_spread: float = 1.5   # only to name an arm as noisy in an inconclusive reason


def _value(run: Any) -> float | None:
    """The positive finite throughput of one run (a number or {'throughput': ...}), else None."""
    value = number(run.get("throughput") if isinstance(run, dict) else run)
    return value if value is not None and math.isfinite(value) and value > 0 else None


def arm(runs: list[Any]) -> dict[str, Any]:
    """{'runs': [...], 'median', 'spread'} of one arm; median and spread are None when a run lacks a value."""
    values = [_value(r) for r in runs]
    present = [v for v in values if v is not None]
    whole = bool(values) and len(present) == len(values)
    return {"runs": values, "median": statistics.median(present) if whole else None,
            "spread": max(present) / min(present) if whole else None}


def _t_density(x: float, df: int) -> float:
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    return float(scale * (1 + x * x / df) ** (-(df + 1) / 2))


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0, Simpson's rule on the density (smooth: 400 panels are plenty)."""
    steps = 400
    h = t / steps
    total = _t_density(0, df) + _t_density(t, df)
    total += sum((4 if i % 2 else 2) * _t_density(i * h, df) for i in range(1, steps))
    return 0.5 + total * h / 3


@functools.lru_cache(maxsize=256)
def t_quantile(confidence: float, df: int) -> float:
    """The one-sided Student-t quantile: P(T <= q) = confidence, df degrees of freedom (bisection)."""
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < confidence:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_cdf(mid, df) < confidence else (low, mid)
    return (low + high) / 2


def bounds(ratios: list[float], confidence: float) -> tuple[float, float, float]:
    """(geometric mean, low, high) of the pairs' ratios: the one-sided bounds at `confidence` (n >= 2)."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = statistics.fmean(logs)
    spread = max(statistics.stdev(logs), NOISE_FLOOR) * t_quantile(confidence, n - 1) / math.sqrt(n)
    return math.exp(mean), math.exp(mean - spread), math.exp(mean + spread)


def verdict(ratios: list[float], rule: Rule) -> Literal["pass", "fail"] | None:
    """pass or fail once the bounds lie on one side of min_ratio, from min_pairs pairs on; None: run another."""
    if len(ratios) < max(rule.min_pairs, 2):
        return None
    _, low, high = bounds(ratios, rule.confidence)
    return "pass" if low >= rule.min_ratio else "fail" if high < rule.min_ratio else None


def band(aligned: list[Any], control: list[Any], confidence: float) -> dict[str, float] | None:
    """{'ratio', 'low', 'high'}: the pairs' ratio and its bounds at `confidence` (one pair: a point), as the gate
    decides; None when a run lacks its value or the arms are not pairs."""
    a, c = arm(aligned)["runs"], arm(control)["runs"]
    if not a or len(a) != len(c) or None in a or None in c:
        return None
    ratios = [x / y for x, y in zip(a, c, strict=True)]
    ratio, low, high = bounds(ratios, confidence) if len(ratios) > 1 else (ratios[0],) * 3
    return {"ratio": ratio, "low": low, "high": high}


def _show(values: list[float | None]) -> str:
    return ", ".join("missing" if v is None else f"{v:.4g}" for v in values)


def decide(aligned: list[Any], control: list[Any], rule: Rule,
           metric: str = "throughput") -> tuple[Status, str, dict[str, Any]]:
    """(status, reason, evidence) on the runs so far, paired by index: fail when a run has no value or the arms'
    counts differ; else the sequential rule; inconclusive when it has not decided (too few pairs, or the maximum
    reached with the bounds on both sides of min_ratio)."""
    a, c = arm(aligned), arm(control)
    evidence: dict[str, Any] = {"metric": metric, "min_ratio": rule.min_ratio, "confidence": rule.confidence,
                                "min_pairs": rule.min_pairs, "max_pairs": rule.max_pairs,
                                "max_spread": rule.max_spread, "aligned": a, "control": c, "ratio": None,
                                "pairs": 0, "stopped": None}
    for name, side in (("aligned", a), ("control", c)):
        if not side["runs"]:
            return "fail", f"no {name} runs", evidence
        missing = [i + 1 for i, v in enumerate(side["runs"]) if v is None]
        if missing:
            return "fail", f"{name} run(s) {missing}: no positive finite {metric}", evidence
    if len(a["runs"]) != len(c["runs"]):
        return "fail", f"{len(a['runs'])} aligned runs but {len(c['runs'])} control runs: not pairs", evidence
    ratios = [x / y for x, y in zip(a["runs"], c["runs"], strict=True)]
    n = evidence["pairs"] = len(ratios)
    evidence["pair_ratios"] = ratios
    runs = f"aligned {_show(a['runs'])}; control {_show(c['runs'])}"
    if n < 2:
        evidence["ratio"] = ratios[0]
        evidence["stopped"] = "too few pairs"
        return "inconclusive", f"{n} pair: at least 2 are needed to bound the ratio ({runs})", evidence
    ratio, low, high = bounds(ratios, rule.confidence)
    evidence.update({"ratio": ratio, "bounds": {"low": low, "high": high}})
    found = verdict(ratios, rule)
    where = (f"aligned / control {metric} {ratio:.3g} over {n} pairs, {rule.confidence:g} bounds {low:.3g} to "
             f"{high:.3g}")
    if found == "fail":
        evidence["stopped"] = f"decided after {n} pairs"
        return "fail", f"{where}: even the upper bound is < min_ratio {rule.min_ratio:g} ({runs})", evidence
    if found == "pass":
        evidence["stopped"] = f"decided after {n} pairs"
        return "pass", f"{where}: the lower bound is >= min_ratio {rule.min_ratio:g} ({runs})", evidence
    evidence["stopped"] = ("maximum of pairs reached" if n >= rule.max_pairs else f"stopped after {n} pairs,"
                           f" below the maximum {rule.max_pairs}")
    noisy = [f"{name} spread {side['spread']:.3g}" + (f" > {rule.max_spread:g}" if side["spread"] > rule.max_spread
                                                         else "")
             for name, side in (("aligned", a), ("control", c))]
    return "inconclusive", (f"{where} lie on both sides of min_ratio {rule.min_ratio:g} after {n} pairs "
                            f"({evidence['stopped']}): the runs are too noisy to decide, the machine was loaded? "
                            f"({', '.join(noisy)}; {runs})"), evidence
