"""The bisect use case (`builder bisect GOOD BAD`, builder/bisect/): each candidate built from BAD's pins with only
the commits changed, gated by the gates that failed in BAD, under this bisect's own local names; the night a
`--good-night`/`--bad-night` names; the night's own run as the bisection's BAD step (`nightly --bisect`)."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from builder.bisect import answer as answers
from builder.bisect import session, sides
from builder.bisect.search import Step, gated
from builder.core import log
from builder.core.errors import BadInput, BuildFailed, InfraError
from builder.core.options import Settings
from builder.engine import client as engine
from builder.gating.plan import Flags
from builder.gating.plan import make as make_plan
from builder.image import build as build_stage
from builder.lock import record as lock_record
from builder.nightly.history import open_history
from builder.pipeline.building import EngineDoor, build, checked_lock, render
from builder.report import document
from builder.runners import factory as runners
from builder.sources import mirror
from builder.sources import resolve as sources


def bisect(good_path: Path, bad_path: Path, settings: Settings, flags: Flags, json_path: Path | None = None,
           max_steps: int | None = None) -> dict[str, Any]:
    """`builder bisect GOOD BAD` (builder/bisect/): each candidate built from BAD's pins with only the commits
    changed, under this bisect's local names (builder-run/<run id>), gated by the gates that failed in BAD (or
    `flags.gates`), and removed at the end. The state file in the bisect directory makes a rerun resume."""

    good, bad = sides.load(good_path, "GOOD"), sides.load(bad_path, "BAD")
    key = hashlib.sha256(f"{good.label}\n{bad.label}".encode()).hexdigest()[:12]
    out_dir = flags.out or settings.cache("bisect", f"{bad.pins.name}-{key}")
    out_dir.mkdir(parents=True, exist_ok=True)
    state = out_dir / answers.STATE
    run_id = json.loads(state.read_text()).get("run_id", settings.run_id) if state.is_file() else settings.run_id
    settings = replace(settings, run_id=run_id)
    if not state.is_file():  # the run id from the start: `builder gc` spares the directory while it is live
        answers.save_state(state, good.label, bad.label, run_id, [])
    door, gates, exported = EngineDoor(settings), list(flags.gates), list[Path]()
    if state.is_file() and not gates:  # resumed: BAD's failing gates from its saved step
        gates += next((s.get("failed", []) for s in json.loads(state.read_text())["steps"] if s["why"] == "BAD"), [])
    resolved_bad = sources.resolve(bad.pins, settings, bisect=True)
    heads = {n: c.target_head for n, c in resolved_bad.components.items()}

    def probe(commits: dict[str, str], why: str) -> Step:
        pins = sides.candidate_pins(bad.pins, commits, out_dir)
        started = time.monotonic()
        built, image_id = None, ""
        try:
            resolved = sources.resolve(pins, settings, flags.offline, bisect=True)
            rendered = render(pins, checked_lock(pins, resolved, settings), resolved, settings)
            built = build(rendered, settings, quiet=True, client=door.client())
            image = image_id = built.image_id
        except (BadInput, BuildFailed) as exc:
            image = sides.stored_image(good, door.client()) if why == "GOOD" else ""  # GOOD's commits gone
            if not image or not good.image_id:
                return Step(commits, "skip", why, time.monotonic() - started, 0.0, "build",
                            str(exc).splitlines()[0][:300])
            image_id = good.image_id
            log.info(f"bisect: GOOD does not resolve or build ({str(exc)[:200]}): its stored image {image[:19]}"
                     f"{'' if image == image_id else ' (published; pulled by digest)'}")
            resolved = document.load(Path(good.label)).sources
        build_s, started = time.monotonic() - started, time.monotonic()
        plan = make_plan(pins, replace(flags, gates=gates or list(pins.acceptance.required_gates)), settings).acceptance
        exported.extend(runners.new_exports(plan, image_id))  # --slurm: the candidate's .sqsh is this bisect's too
        result, verdict, tries = gated(lambda: runners.gate_image(plan, pins, image, image_id, settings, door.client()))
        failed = [g for g in result.gates if g.status == "fail"]
        inconclusive = [g for g in result.gates if g.status == "inconclusive"]
        report = document.make_report(pins, lock_record.of(pins), resolved, built, result)
        run_dir = out_dir / f"step-{hashlib.sha256(repr(sorted(commits.items())).encode()).hexdigest()[:10]}"
        document.write(report, run_dir)
        if failed and not gates:
            gates.extend(g.name for g in failed)  # BAD's failing gates: the only ones later steps run
        first = (failed or inconclusive)[:1]
        reason = (f"inconclusive in {tries} runs: " if verdict == "skip" else "") + (first[0].reason if first else "")
        return Step(commits, verdict, why, build_s, time.monotonic() - started, first[0].name if first else "",
                    reason, str(run_dir), [g.name for g in failed])

    try:
        answer = session.run(good, bad, probe, lambda n: mirror.open_mirror(settings, bad.pins.component_url(n)),
                             heads, out_dir, run_id, max_steps)
    finally:
        # every local name of this bisect's run (a killed earlier process's too), none other: the image may be
        # another run's as well (GOOD's commits are the demo's), whose release tags and names are not ours
        mine = f"{build_stage.LOCAL_REPOSITORY}/{run_id}"
        try:
            for tag in [t for i in engine.local_images(door.client(), mine) for t in i.tags if t.startswith(mine + ":")]:
                engine.untag(door.client(), tag)
        except InfraError as exc:  # the engine went away: the error that ended the bisect is the one to say
            log.info(f"bisect: its local names {mine}:* stay ({exc.headline()}); builder gc removes them")
        for path in exported:  # the .sqsh exports it made (never one that was there before it)
            for each in (path, *(path.with_name(path.name + s) for s in (".json", ".sha256"))):
                each.unlink(missing_ok=True)
            path.with_name(f".{path.name}.lock").unlink(missing_ok=True)
    if answer.get("companion"):
        answer["companion_pins"] = str(sides.candidate_pins(bad.pins, answer["companion"], out_dir, "first-bad.yaml").path)
    paths = answers.write(answer, out_dir, json_path)
    log.info(f"bisect: {paths['md']}")
    return answer


def bisect_night(settings: Settings, name: str | None, night: str, which: str) -> Path:
    """The report.json of a night of the history (`night`: a run id or a date); exit 2 naming a night that is
    not there or whose report is gone."""

    return sides.night(open_history(settings), name, night, which)


def night_as_bad_step(good: Path, run_dir: Path, flipped: list[str], out: Path, run_id: str) -> None:
    """The night's own run is the bisection's BAD check (the same commits, just accepted: its flipped gates
    failed), written as the state file's first step: BAD is not built and gated again."""

    night = document.load(run_dir / "report.json")
    first = next(g for g in night.gates if g.name == flipped[0])
    step = Step({n: c.commit for n, c in night.sources.components.items()}, "bad", "BAD", gate=first.name,
                reason=first.reason, run_dir=str(run_dir), failed=flipped)
    out.mkdir(parents=True, exist_ok=True)
    answers.save_state(out / answers.STATE, str(good), str(run_dir / "report.json"), run_id, [step])
    log.info(f"nightly --bisect: BAD is this night's run ({first.name} failed): not built again")
