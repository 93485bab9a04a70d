"""One bisection: the preconditions, which component, the search per component, the answer.

The probe (builder/pipeline/bisecting.py: build the candidate under run-scoped local names, run the gates) is given; every step
goes to the state file as it ends, so a killed bisect resumes where it stopped."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pygit2

from builder.bisect import answer as answers
from builder.bisect import commits as ranges
from builder.bisect import search as searching
from builder.bisect.sides import Side, differences
from builder.core import log
from builder.core.errors import NotAccepted
from builder.gating.replay import bundle_file

Probe = searching.Probe


def run(good: Side, bad: Side, probe: Probe, repos: Callable[[str], pygit2.Repository], target_heads: dict[str, str],
        out_dir: Path, run_id: str, max_steps: int | None) -> dict[str, Any]:
    """The answer (also written to the state file, step by step); NotAccepted (1) when BAD passes, GOOD fails or
    --max-steps ran out."""
    state = out_dir / answers.STATE
    done = answers.load_state(state, good.label, bad.label)
    order: list[searching.Step] = list(done.values())

    def on_step(step: searching.Step, left: int) -> None:
        order.append(step)
        answers.save_state(state, good.label, bad.label, run_id, order)
        log.info(f"bisect: {step.why}: {step.verdict} (build {step.build_s:.0f} s, gates {step.gate_s:.0f} s)"
                 f"{': ' + step.gate + ': ' + step.reason if step.gate else ''}"
                 f"{'; a check' if left < 0 else f'; at most {left} step(s) left'}")

    search = searching.Search(probe, done, max_steps, on_step=on_step)
    try:
        return _search(good, bad, search, repos, target_heads, order)
    except searching.OutOfSteps as exc:
        raise NotAccepted(f"--max-steps {max_steps}: ran out; left: {exc.left} (state {state})") from None


def _search(good: Side, bad: Side, search: searching.Search, repos: Callable[[str], pygit2.Repository],
            target_heads: dict[str, str], order: list[searching.Step]) -> dict[str, Any]:
    bad_step = search.run(bad.commits, "BAD")
    if bad_step.verdict != "bad":
        raise NotAccepted(f"BAD passes: nothing to bisect ({bad.label})" if bad_step.verdict == "good" else
                          f"BAD does not build: {bad_step.gate}: {bad_step.reason}")
    good_step = search.run(good.commits, "GOOD")
    if good_step.verdict != "good":
        raise NotAccepted(f"GOOD fails: nothing to bisect ({good.label}: {good_step.gate}: {good_step.reason})")
    who = searching.culprits(search, good.commits, bad.commits)
    notes, found = [who.note], []
    log.info(f"bisect: {who.note}")
    for name in who.components:
        span = ranges.commit_range(repos(name), name, good.commits[name], bad.commits[name], target_heads[name])
        if span.note:
            notes.append(span.note)
            log.info(f"bisect: {span.note}")  # the force-push case: said as it is decided
        base = {**(bad.commits if who.held == "BAD" else good.commits)}
        found.append((span, searching.bisect(search, name, base, good.commits[name], [c.sha for c in span.commits])))
    return _answer(good, bad, who, notes, found, order, search)


def _answer(good: Side, bad: Side, who: searching.Culprits, notes: list[str],
            found: list[tuple[ranges.Range, searching.Found]], order: list[searching.Step],
            search: searching.Search) -> dict[str, Any]:
    span, hit = found[0]
    by_sha = {c.sha: c for _, f in found for c in _commits(f, span)}
    by_sha.update({c.sha: c for s, _ in found for c in s.commits})
    first = None
    base = bad.commits if who.held == "BAD" else good.commits
    companion = {**base, hit.component: hit.first_bad} if hit.first_bad else None
    step = search.done.get(searching.key_of(companion)) if companion else None
    if hit.first_bad:
        c = by_sha[hit.first_bad]
        comp = bad.pins.components[hit.component]
        first = {"component": hit.component, "commit": c.sha, "pr": comp.pr, "subject": c.subject,
                 "author": c.author, "repo": bad.pins.component_url(hit.component),
                 "gate": step.gate if step else "", "reason": step.reason if step else ""}
    last = by_sha.get(hit.last_good)
    for _, other in found[1:]:  # the two-repository case: each component's own first bad commit
        named = by_sha.get(other.first_bad or "")
        notes.append(f"{other.component}: first bad {named.sha[:12]} {named.subject}" if named else
                     f"{other.component}: first bad one of {', '.join(c[:12] for c in other.candidates)}")
    replay = str(Path(step.run_dir) / bundle_file(step.gate)) if step and step.gate else ""
    checks = 2 + (len([s for s in order if s.why.endswith("back to GOOD")]))
    n = max(len(s.commits) for s, _ in found)
    skipped = sorted({c for _, f in found for c in f.skipped})
    return {
        "good": good.label, "bad": bad.label, "notes": notes, "components": who.components, "together": who.together,
        "first_bad": first, "range": [] if hit.first_bad else hit.candidates,
        "last_good": {"component": hit.component, "commit": hit.last_good, "subject": last.subject if last else "GOOD"},
        "companion": companion, "companion_pins": "", "replay": replay,
        "other_differences": differences(good, bad), "skipped": skipped,
        "steps": [s.as_dict() for s in order], "builds": len(order),
        "bound": searching.steps_left(n - 1) * len(found) + len(skipped) + checks,
        "found": [{"component": f.component, "first_bad": f.first_bad, "candidates": f.candidates} for _, f in found],
    }


def _commits(found: searching.Found, span: ranges.Range) -> list[ranges.Commit]:
    return [c for c in span.commits if c.sha in found.candidates]
