"""The search: which component's change is needed, then a binary search over its commits with skips.

Each probe is a full set of commits {component: sha}; `Probe` (given by the use case) builds and accepts it and
returns a `Step`. A step already in the state file is never probed again (resume)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

from builder.core.records import AcceptanceResult

Verdict = Literal["good", "bad", "skip"]
INCONCLUSIVE_TRIES = 3  # a step whose gates are inconclusive (the performance gate's noise) runs them this often


@dataclass(frozen=True)
class Step:
    commits: dict[str, str]       # the whole candidate: every component's commit
    verdict: Verdict
    why: str                      # what the step checked ("GOOD", "BAD", "verl back to GOOD", "verl 3/6")
    build_s: float = 0.0
    gate_s: float = 0.0
    gate: str = ""                # the first gate that failed (bad), or the stage that failed (skip)
    reason: str = ""              # its one-line reason
    run_dir: str = ""             # the step's report (bad: the replay bundle beside it)
    failed: list[str] = field(default_factory=list)  # every gate that failed (BAD's: the gates later steps run)

    def key(self) -> str:
        return key_of(self.commits)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def gated(accept: Callable[[], AcceptanceResult]) -> tuple[AcceptanceResult, Verdict, int]:
    """A step's gates, their verdict and how many runs it took. A failing gate decides (bad), and so does a pass
    of every gate (good), in one run: the exact gates are not noisy. Only an inconclusive gate with none failing
    (the performance gate's noise, after its own repeats) runs them again, INCONCLUSIVE_TRIES runs in all; then
    the step is skipped."""
    for tries in range(1, INCONCLUSIVE_TRIES + 1):
        result = accept()
        statuses = {g.status for g in result.gates}
        if "fail" in statuses or "inconclusive" not in statuses:
            break
    verdict: Verdict = "bad" if "fail" in statuses else "skip" if "inconclusive" in statuses else "good"
    return result, verdict, tries


def key_of(commits: dict[str, str]) -> str:
    return " ".join(f"{n}={c}" for n, c in sorted(commits.items()))


Probe = Callable[[dict[str, str], str], Step]


class OutOfSteps(Exception):
    """--max-steps ran out; `left` names the range still open."""

    def __init__(self, left: str) -> None:
        super().__init__(left)
        self.left = left


@dataclass
class Search:
    """The steps so far (from the state file on resume), the probe, and the bound on new steps."""

    probe: Probe
    done: dict[str, Step] = field(default_factory=dict)
    max_steps: int | None = None
    new_steps: int = 0
    on_step: Callable[[Step, int], None] = lambda step, left: None

    def run(self, commits: dict[str, str], why: str, left: int = -1) -> Step:  # -1: a check, not a search step
        known = self.done.get(key_of(commits))
        if known is not None:
            return known
        if self.max_steps is not None and self.new_steps >= self.max_steps:
            raise OutOfSteps(why)
        step = self.probe(commits, why)
        self.new_steps += 1
        self.done[step.key()] = step
        self.on_step(step, left)
        return step


@dataclass(frozen=True)
class Culprits:
    components: list[str]    # the components to bisect
    together: bool           # their changes are needed together (each reverted alone passes)
    held: str                # "BAD" or "GOOD": where the other components stay while one is bisected
    note: str


def culprits(search: Search, good: dict[str, str], bad: dict[str, str]) -> Culprits:
    """BAD with one moved component set back to GOOD, for each: those whose revert passes are needed."""
    moved = [n for n in bad if good.get(n) != bad[n]]
    if len(moved) == 1:
        return Culprits(moved, False, "BAD", f"only {moved[0]} moved")
    needed = [n for n in moved if search.run({**bad, n: good[n]}, f"{n} back to GOOD").verdict == "good"]
    if len(needed) == 1:
        return Culprits(needed, False, "BAD", f"{needed[0]} back to GOOD passes; the others' changes are not needed")
    if needed:
        return Culprits(needed, True, "BAD", f"the failure needs {' and '.join(needed)} together: each back to GOOD "
                        "passes; each is bisected with the others held at BAD")
    return Culprits(moved, False, "GOOD", "no single component back to GOOD passes: each moved component is "
                    "bisected alone, the others held at GOOD")


@dataclass(frozen=True)
class Found:
    component: str
    first_bad: str | None         # None: a range (skipped commits border it) or out of steps
    last_good: str                # a commit of the range, or GOOD's commit
    candidates: list[str]         # the commits that may be the first bad one (one when exact)
    skipped: list[str]


def steps_left(open_count: int) -> int:
    """Probes a binary search over `open_count` untested commits needs at most."""
    return math.ceil(math.log2(open_count + 1)) if open_count > 0 else 0


def bisect(search: Search, component: str, base: dict[str, str], good: str, commits: list[str]) -> Found:
    """First bad commit of `commits` (oldest first; the last one fails, `good` passes) with the other components
    as in `base`. A skipped probe moves to the nearest untested commit; skipped commits next to the answer make
    it a range."""
    lo, hi, skipped = -1, len(commits) - 1, set[int]()
    while True:
        open_ = [i for i in range(lo + 1, hi) if i not in skipped]
        if not open_:
            break
        mid = (lo + hi) // 2
        i = min(open_, key=lambda j: (abs(j - mid), j))
        left = steps_left(len(open_) - 1)
        try:
            step = search.run({**base, component: commits[i]}, f"{component} {i + 1}/{len(commits)}", left)
        except OutOfSteps:
            raise OutOfSteps(f"{component}: first bad commit among {commits[lo + 1][:12]}..{commits[hi][:12]}"
                             f" ({hi - lo} commits)") from None
        if step.verdict == "good":
            lo = i
        elif step.verdict == "bad":
            hi = i
        else:
            skipped.add(i)
    last_good = commits[lo] if lo >= 0 else good
    span = commits[lo + 1:hi + 1]
    return Found(component, span[0] if len(span) == 1 else None, last_good, span,
                 [commits[i] for i in sorted(skipped)])
