"""The performance decision: aligned over control throughput on the medians of interleaved runs, with a
noise bound (stdlib only: it runs in the image, on the host for the report and in nightly's regression flag).

A run whose throughput is missing fails; an arm whose spread (max / min over its runs) passes `max_spread`
makes the result inconclusive, with the runs listed; otherwise the ratio of the medians decides."""
from __future__ import annotations

import math
import statistics
from typing import Any, Literal

from acceptance.metrics import number


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


def decide(aligned: list[Any], control: list[Any], min_ratio: float, max_spread: float,
           metric: str = "throughput") -> tuple[Literal["pass", "fail", "inconclusive"], str, dict[str, Any]]:
    """(status, reason, evidence): pass when median(aligned) / median(control) >= min_ratio and both arms'
    spreads are within max_spread; inconclusive when a spread is over; fail when a run has no value or
    the ratio is below min_ratio."""
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
    for name, side in (("aligned", a), ("control", c)):
        if side["spread"] > max_spread:
            return ("inconclusive", f"{name} runs too noisy: spread {side['spread']:.3g} > {max_spread:g} "
                    f"({metric}: {_show(side['runs'])}); ratio of medians {ratio:.3g} not judged", evidence)
    runs = f"aligned {_show(a['runs'])}; control {_show(c['runs'])}"
    if ratio < min_ratio:
        return ("fail", f"aligned / control {metric} {ratio:.3g} < min_ratio {min_ratio:g} "
                f"(medians {a['median']:.4g} / {c['median']:.4g}; {runs})", evidence)
    return ("pass", f"aligned / control {metric} {ratio:.3g} >= min_ratio {min_ratio:g} "
            f"(medians {a['median']:.4g} / {c['median']:.4g}; spreads {a['spread']:.3g}, {c['spread']:.3g}"
            f" <= {max_spread:g})", evidence)
