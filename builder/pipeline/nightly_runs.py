"""The nightly use cases: `builder nightly` (follow PR heads, accept, publish, diff with the last accepted night,
the history row, the page and the notification, `--bisect`), a fleet of pins files, `gc`, and the views of the
history: `builder history` (the page) and `builder compare`."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from builder.core import files as fs
from builder.core import log
from builder.core.errors import BuilderError, NotAccepted, Regression
from builder.core.options import Settings
from builder.gating.plan import Flags, Plan
from builder.nightly import compare as compare_mod
from builder.nightly import fleet, follow, notify, page, rundiff
from builder.nightly import gc as housekeeping
from builder.nightly.history import History, open_history
from builder.pins.model import Pins
from builder.pipeline.accepting import Run, accept_on, image_manifest
from builder.pipeline.bisecting import bisect, night_as_bad_step
from builder.pipeline.building import EngineDoor
from builder.pipeline.releasing import publish_report
from builder.report import document


def nightly(pins: Pins, plan: Plan, settings: Settings, history: History | None = None,
            bisect_red: bool = False) -> Run:
    """Follow PR heads (when the plan asks), run, diff with the last accepted run of the same pins name, move the
    nightly tags. NotAccepted (1) when not accepted, Regression (4) when accepted with a regression flag.
    `bisect_red`: a gate that flipped from pass to fail against the last accepted night starts `builder bisect`."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    settings = settings.for_release(pins.image.repository)  # BUILDER_REGISTRY_* belong to the release's host
    pins_path = pins.path
    moved: list[dict[str, Any]] = []
    publish, key, today = plan.flags.publish, plan.flags.key, plan.flags.today
    if plan.flags.follow_prs:
        with log.step("follow PR heads"):
            pins, moved = follow.follow_prs(pins, settings)
        log.info(f"moved: {len(moved)} component(s)" if moved else "no PR head moved")
    history = history or open_history(settings)
    previous = follow.previous(history, pins.name)
    door = EngineDoor(settings)  # one engine client: acceptance, the image's manifest, publish
    done = accept_on(pins, replace(plan, acceptance=replace(plan.acceptance, stage=True)), settings, door)
    report, run_dir = done.report, done.run_dir
    manifest = image_manifest(door.client(), report.image_id)
    fs.write_atomic(run_dir / "image-manifest.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    accepted = report.verdict == "ACCEPTED"
    digest, tags = None, None
    if accepted and publish:
        receipt = publish_report(run_dir / "report.json", settings, key=key, attest_once=True,  # never re-attest
                                 client=door.client(), nightly=follow.nightly_tags(today))
        digest = receipt.digest
        tags = follow.move_tags(receipt.repository, digest, pins.nightly.retention, settings, today)
        report = document.load(run_dir / "report.json")
    with log.step("compare with the last accepted run"):
        diff = rundiff.compare(report, manifest, digest, previous.report, previous.manifest, previous.digest,
                               pins.nightly.regression_threshold, follow.commit_log(report, previous.report, settings))
        diff["moved"], diff["tags"] = moved, tags
        paths = rundiff.write(diff, run_dir)
    flag = bool(diff["regression"]["flag"])
    code = (Regression.exit_code if flag else 0) if accepted else NotAccepted.exit_code
    history.add(pins.name, started, report.verdict, report.image_id, digest,
                {n: c.commit for n, c in report.sources.components.items()}, run_dir / "report.json", code, flag,
                kind="nightly")
    first_bad = "" if accepted or not bisect_red else _nightly_bisect(history, pins.name, run_dir, settings, plan)
    nightly_page(history, run_dir, settings, flag, diff["regression"]["reasons"], digest, first_bad)
    log.info(f"nightly: {diff['summary']}")
    for reason in diff["regression"]["reasons"]:
        log.info(f"regression: {reason}")
    log.info(f"nightly diff: {paths['md']}")
    done.require_accepted(pins_path)
    if flag:
        raise Regression(f"{pins_path}: accepted, but a regression flag is up; see {paths['md']}")
    return done


def gc(settings: Settings, older_than_s: float = housekeeping.WEEK_S,
       keep_runs: int = housekeeping.KEEP_RUNS) -> housekeeping.Freed:
    """Remove finished runs' contexts, builds, run dirs, logs, seeds, raw layers and run tags by the retention
    rule (builder/nightly/gc.py); what a live run holds stays."""
    return housekeeping.gc(settings, older_than_s=older_than_s, keep_runs=keep_runs, client=EngineDoor(settings).client())


def nightly_fleet(pins_paths: list[Path], flags: Flags, settings: Settings, jobs: int | None) -> int:
    """Several pins files as a fleet: one `builder nightly` process each, at most `jobs` at once (default 1;
    with --slurm all at once: each submits its gates and the cluster schedules them); returns the most
    severe of their exit codes (core/errors.py SEVERITY)."""
    argv = [*(["--follow-prs"] if flags.follow_prs else []), *(["--publish"] if flags.publish else []),
            *(["--key", str(flags.key)] if flags.key else []), *(["--slurm"] if flags.slurm else [])]
    parallel = jobs or (min(len(pins_paths), fleet.MAX_JOBS) if flags.slurm else 1)
    outcomes = fleet.run_fleet(fleet.plan(pins_paths, flags.out, settings), parallel, argv)
    return fleet.severest([o.code for o in outcomes])


COMPARE_FORMATS = compare_mod.FORMATS


def history_page(settings: Settings, names: list[str] | None = None, last: int = page.DEFAULT_LAST,
                 out: Path | None = None, history: History | None = None) -> Path:
    """`builder history`: the nightly history page (builder/nightly/page.py) of these pins names (default: every
    name in the history), the last `last` nights of each, written to `out` (default: beside the history's rows)."""
    return page.history_page(history or open_history(settings), settings, names, last, out)


def compare(a: str, b: str, settings: Settings, fmt: str = "md", history: History | None = None) -> str:
    """`builder compare A B` (builder/nightly/compare.py): what moved from report A to report B (A may be
    `last-accepted`: the newest accepted run of B's pins name before B), as Markdown, JSON or one HTML page."""
    return compare_mod.compare_text(a, b, history or open_history(settings), settings, fmt)


def nightly_page(history: History, run_dir: Path, settings: Settings, flag: bool, reasons: list[str],
                 digest: str | None, first_bad: str = "") -> Path | None:
    """After a nightly's row: the timings, lock copy and history page (builder/nightly/page.py), then the
    notification (builder/nightly/notify.py); neither changes the nightly's verdict or exit code."""
    report = document.load(run_dir / "report.json")
    where = page.write_night(history, run_dir, report, settings, log.timings)
    notify.notify_night(history, report, run_dir / "report.json", settings, flag, reasons, digest, where, first_bad)
    return where


def _nightly_bisect(history: History, name: str, run_dir: Path, settings: Settings, plan: Plan) -> str:
    """`nightly --bisect`: bisect from the last accepted night to this one over the gates that flipped from pass
    to fail (into bisect/ beside the report); what it names, for the page and the message. A bisect that cannot
    run or ends without an answer is one line: the nightly's verdict and exit code stand."""
    last = history.last_accepted(name)
    if last is None:
        log.info("nightly --bisect: no accepted night to bisect from")
        return ""
    before = {g.name: g.status for g in document.load(last.report_path).gates}
    flipped = [g.name for g in document.load(run_dir / "report.json").gates
               if g.status == "fail" and before.get(g.name) == "pass"]
    if not flipped:
        log.info("nightly --bisect: no gate flipped from pass to fail; nothing to bisect")
        return ""
    flags = Flags(gates=flipped, slurm=plan.acceptance.on_cluster, out=run_dir / page.BISECT)
    # a run id of its own: its candidates' local names (removed at its end) are not the night's
    night_as_bad_step(Path(last.report_path), run_dir, flipped, run_dir / page.BISECT, f"{settings.run_id}-bisect")
    try:
        answer = bisect(Path(last.report_path), run_dir / "report.json", settings, flags)
    except BuilderError as exc:
        log.info(f"nightly --bisect: {exc.headline()}; the verdict stands")
        return ""
    first = answer.get("first_bad")
    if first:
        return f"{first['component']} {first['commit'][:12]} (PR #{first['pr']}) {first['subject']}: {first['gate']}"
    return "one of " + ", ".join(c[:12] for c in answer.get("range", []))
