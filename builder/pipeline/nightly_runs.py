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
from builder.core.errors import BadInput, BuilderError, NotAccepted, Regression
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
from builder.report import html as report_page


def nightly(pins: Pins, plan: Plan, settings: Settings, history: History | None = None,
            bisect_red: bool = False) -> Run:
    """Follow PR heads (when the plan asks), run, diff with the last accepted run of the same pins name, move the
    nightly tags. NotAccepted (1) when not accepted, Regression (4) when accepted with a regression flag.
    `bisect_red`: a gate that flipped from pass to fail against the last accepted night starts `builder bisect`."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    settings = settings.for_release(pins.image.repository)  # BUILDER_REGISTRY_* belong to the release's host
    pins_path = pins.path
    moved: list[dict[str, Any]] = []
    publish, key, today = plan.publish, plan.key, plan.today
    if plan.follow_prs:
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


COMPARE_FORMATS = ("md", "json", "html")


def history_page(settings: Settings, names: list[str] | None = None, last: int = page.DEFAULT_LAST,
                 out: Path | None = None, history: History | None = None) -> Path:
    """The nightly history page (builder/nightly/page.py) of these pins names (default: every name in the history),
    the last `last` nights of each, written to `out` (default: history.html beside the history's rows)."""
    if last < 1:
        raise BadInput(f"--last: expected at least 1 night, got {last}")
    history = history or open_history(settings)
    path = out or history.path.parent / page.PAGE
    with log.step("history page"):
        page.write(page.render(history, settings, names, last), path)
    return path


def compare(a: str, b: str, settings: Settings, fmt: str = "md", history: History | None = None) -> str:
    """What moved from report A to report B (A may be `last-accepted`: the newest accepted run of B's pins name
    before B): commits, lock lines, layers, gate evidence, the throughput against the gate's noise; as Markdown,
    JSON or one HTML page."""
    if fmt not in COMPARE_FORMATS:
        raise BadInput(f"--format: expected md, json or html, got {fmt[:40]!r}")
    (old, old_path), (new, new_path) = compare_mod.load_pair(a, b, history or open_history(settings))
    diff = compare_mod.compare(old, new, old_path, new_path, settings)
    if fmt == "json":
        return json.dumps(diff, indent=2, sort_keys=True)
    return compare_mod.to_html(diff) if fmt == "html" else compare_mod.to_markdown(diff)


def nightly_page(history: History, run_dir: Path, settings: Settings, flag: bool, reasons: list[str],
                 digest: str | None, first_bad: str = "") -> Path | None:
    """After a nightly's row: its step timings and lock copy beside the report, the history page beside the rows
    (and a copy in the run directory), then the notification when the verdict flipped or a regression flag went
    up. A page or a notification that fails never changes the nightly's verdict or exit code: one line each."""
    report_json = run_dir / "report.json"
    report = document.load(report_json)
    fs.write_atomic(run_dir / page.TIMINGS, json.dumps(log.timings, indent=1, sort_keys=True) + "\n")
    lock_file = Path(str((report_page.plain(report.run_manifest).get("run") or {}).get("lock_file") or "-"))
    if lock_file.is_file() and fs.sha256_file(lock_file) == report.lock_sha256:
        fs.write_atomic(run_dir / compare_mod.LOCK_COPY, lock_file.read_bytes())
    where: Path | None = history.path.parent / page.PAGE
    try:
        page.write(page.render(history, settings), run_dir / page.PAGE, history.path.parent / page.PAGE)
        log.info(f"history page: {where}")
    except Exception as exc:  # the page is a view: the verdict stands without it
        where = None
        log.info(f"history page not written: {type(exc).__name__}: {str(exc)[:200]}")
    rows = history.runs(report.name)
    mine = max((i for i, r in enumerate(rows) if r.report_path == str(report_json)), default=len(rows))
    previous = rows[mine - 1] if mine > 0 else None
    try:
        before = document.load(previous.report_path) if previous else None
    except BadInput:
        before = None  # its report is gone: the message names no fixed gate
    notify.notify(settings, previous, before, report, flag, reasons, digest, where, first_bad=first_bad)
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
