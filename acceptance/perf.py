"""The performance decision: aligned over control throughput on the medians of interleaved runs, with a
noise bound (stdlib only: it runs in the image, on the host for the report and in nightly's regression flag).

A run whose throughput is missing fails. When both arms' spreads (max / min over its runs) are within
`max_spread`, the ratio of the medians decides. When an arm is noisier, the bounds decide where they can: the
best aligned run over the worst control run below `min_ratio` fails (no pairing of runs reaches it), the worst
aligned run over the best control run at or above it passes (every pairing reaches it); between the two the
noise leaves it open and the result is inconclusive, with the runs listed."""
from __future__ import annotations

import math
import statistics
from typing import Any, Literal

from acceptance.metrics import number

Status = Literal["pass", "fail", "inconclusive"]


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


def _show(values: list[float | None]) -> str:
    return ", ".join("missing" if v is None else f"{v:.4g}" for v in values)


def _noisy(a: dict[str, Any], c: dict[str, Any], min_ratio: float, why: str, metric: str,
           evidence: dict[str, Any]) -> tuple[Status, str]:
    """A noisy result decided from the bounds of the runs' ratios where they lie on one side of min_ratio."""
    low, high = min(a["runs"]) / max(c["runs"]), max(a["runs"]) / min(c["runs"])
    evidence["bounds"] = {"low": low, "high": high}
    runs = f"aligned {_show(a['runs'])}; control {_show(c['runs'])}"
    if high < min_ratio:
        return "fail", (f"aligned / control {metric}: even the best aligned run over the worst control run, "
                        f"{high:.3g}, is < min_ratio {min_ratio:g}; decided from the bounds although {why} "
                        f"({runs})")
    if low >= min_ratio:
        return "pass", (f"aligned / control {metric}: even the worst aligned run over the best control run, "
                        f"{low:.3g}, is >= min_ratio {min_ratio:g}; decided from the bounds although {why} "
                        f"({runs})")
    return "inconclusive", (f"{why} ({metric}: {runs}); the runs' ratios {low:.3g} to {high:.3g} lie on both "
                            f"sides of min_ratio {min_ratio:g}; ratio of medians {evidence['ratio']:.3g} not "
                            "judged")


def decide(aligned: list[Any], control: list[Any], min_ratio: float, max_spread: float,
           metric: str = "throughput") -> tuple[Status, str, dict[str, Any]]:
    """(status, reason, evidence): fail when a run has no value; with both arms' spreads within max_spread,
    pass when median(aligned) / median(control) >= min_ratio, else fail; with a spread over it, fail or
    pass from the bounds when every pairing of runs lies on one side of min_ratio, else inconclusive."""
    a, c = arm(aligned), arm(control)
    evidence = {"metric": metric, "min_ratio": min_ratio, "max_spread": max_spread, "aligned": a, "control": c,
                "ratio": None}
    for name, side in (("aligned", a), ("control", c)):
        if not side["runs"]:
            return "fail", f"no {name} runs", evidence
        missing = [i + 1 for i, v in enumerate(side["runs"]) if v is None]
        if missing:
            return "fail", f"{name} run(s) {missing}: no positive finite {metric}", evidence
    evidence["ratio"] = ratio = a["median"] / c["median"]
    noisy = [f"{name} runs too noisy: spread {side['spread']:.3g} > {max_spread:g}"
             for name, side in (("aligned", a), ("control", c)) if side["spread"] > max_spread]
    if noisy:
        status, reason = _noisy(a, c, min_ratio, " and ".join(noisy), metric, evidence)
        return status, reason, evidence
    runs = f"aligned {_show(a['runs'])}; control {_show(c['runs'])}"
    if ratio < min_ratio:
        return ("fail", f"aligned / control {metric} {ratio:.3g} < min_ratio {min_ratio:g} "
                f"(medians {a['median']:.4g} / {c['median']:.4g}; {runs})", evidence)
    return ("pass", f"aligned / control {metric} {ratio:.3g} >= min_ratio {min_ratio:g} "
            f"(medians {a['median']:.4g} / {c['median']:.4g}; spreads {a['spread']:.3g}, {c['spread']:.3g}"
            f" <= {max_spread:g})", evidence)
