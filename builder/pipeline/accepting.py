"""The accept use case (`builder accept`): resolve, build unless the plan names an image, stage by digest, the plan's
gates through the runner factory, the report (signed when a key is given), the run joining the history as a run by
hand; replay of one gate's bundle, and a stored report in another format.

    building -> engine.staging.push -> runners.factory.gate_image -> report.document (-> release.attest)
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import log
from builder.core.constants import MANIFEST
from builder.core.errors import BadInput, NotAccepted
from builder.core.options import Settings
from builder.core.records import Report
from builder.engine import client as engine
from builder.engine import staging
from builder.gating import replay as replay_stage
from builder.gating.plan import Plan
from builder.lock import record as lock_record
from builder.nightly import history as history_mod
from builder.nightly.history import open_history
from builder.pins.model import Pins
from builder.pipeline.building import EngineDoor, build, checked_lock, load_pins, render, resolve
from builder.release import attest, dsse
from builder.report import document
from builder.report import html as report_page
from builder.report.ctrf import to_ctrf
from builder.runners import factory as runners


@dataclass(frozen=True)
class Run:
    """What an accept or run use case leaves behind: the report and the run directory holding it."""

    report: Report
    run_dir: Path

    def require_accepted(self, pins_path: Path) -> None:
        """NotAccepted (exit 1) naming the report, unless the verdict is ACCEPTED."""
        if self.report.verdict != "ACCEPTED":
            raise NotAccepted(f"{pins_path}: image {self.report.image_id} not accepted; see {self.run_dir / 'report.md'}")


def accept_pins(pins: Pins, plan: Plan, settings: Settings) -> Run:
    """Resolve, build unless the plan names an image, accept where the plan says, write the report. A staged plan
    pushes the build by digest to the staging repository and acceptance pulls that digest. One engine client for
    the whole use case. The run directory is made only once there is a report to put in it. The run joins the
    history as a run by hand."""
    done = accept_on(pins, plan, settings, EngineDoor(settings))
    history_mod.record_by_hand(open_history(settings), done.report, done.run_dir / "report.json")
    return done


def accept_on(pins: Pins, plan: Plan, settings: Settings, door: EngineDoor) -> Run:
    """accept_pins() on the calling use case's engine client (run, nightly)."""
    settings = settings.for_release(pins.image.repository)  # BUILDER_REGISTRY_* belong to the release's host
    resolved = resolve(pins, settings, plan.flags.offline, plan.flags.allow_moved_pr)
    built = None
    image = plan.acceptance.image
    lock = checked_lock(pins, resolved, settings, plan.flags.offline) if image is None else lock_record.of(pins)
    client = door.client()  # after the lock check: a stale lock is refused (2) with the engine down too
    if image is None:
        built = build(render(pins, lock, resolved, settings), settings, nocache=plan.flags.nocache, client=client)
        image = built.image_id
        if plan.acceptance.stage:
            repo = staging.staging_repository(pins.image.repository, pins.image.staging)
            staged = staging.push(built.manifest_digest, repo, pins.base.name, settings)
            built = built.model_copy(update={"staged": staged})
            image = str(staged)
    with log.step("acceptance"):
        result = runners.gate_image(plan.acceptance, pins, image, built.image_id if built else None, settings, client)
    report = document.make_report(pins, lock, resolved, built, result,
                                  image_manifest=image_manifest(client, result.image_id))
    run_dir = run_directory(plan.flags.out, pins.name, settings)
    paths = document.write(report, run_dir)
    if plan.flags.key is not None:  # publish requires this signature over the acceptance result
        attest.sign_acceptance(report, pins, dsse.load_private(plan.flags.key, settings.key_passphrase), run_dir)
    _print_verdict(report, paths)
    return Run(report, run_dir)


def image_manifest(client: engine.Client, image_id: str) -> dict[str, Any] | None:
    """/opt/delivery/manifest.json of the image, for the report's run manifest."""
    data = engine.read_file(client, image_id, MANIFEST)
    return json.loads(data) if data else None


def run_directory(out: Path | None, name: str, settings: Settings) -> Path:
    path = out or settings.cache("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _print_verdict(report: Report, paths: dict[str, Path]) -> None:
    for gate in report.gates:
        log.info(f"  {gate.name:<12} {gate.status:<13} {gate.reason}")
    log.info(f"verdict: {report.verdict}")
    for kind, path in paths.items():
        log.info(f"report {kind}: {path}")


def replay(report_json: Path, settings: Settings, gate: str | None = None, image: str | None = None,
           slurm: bool | None = None) -> tuple[list[str], int]:
    """Replay one gate's bundle (replay/<gate>.json beside the report) through the same door as the gates: a
    fresh container of the report's image (or `image`) where the report's gates ran, unless `slurm` says where.
    (lines to print, exit code). With no gate named: an ACCEPTED report says nothing failed (exit 0; the control
    arm's difference is the evidence it should be); otherwise the first gate that differed replays, exit 1 while
    it differs. `--gate control` exits 0 when the control arm's difference reproduces exactly."""
    report = document.load(report_json)
    if gate is None and report.verdict == "ACCEPTED":
        return replay_stage.nothing_failed(report), 0
    name, summary = replay_stage.choose(report.gates, gate, str(report_json))
    if not summary.get("differs"):
        return [f"{name}: {summary.get('note') or 'nothing to replay: the gate saw no difference'}"], 0
    bundle = replay_stage.load_bundle(report_json.parent, name)
    pins = load_pins(Path(report.sources.pins_path))
    plan = runners.replay_plan(report, pins, settings, slurm)
    target = image or report.image_id
    started = time.monotonic()
    with log.step(f"replay {name} on {target}"):
        result, image_id = runners.replay(plan, pins, target, settings, EngineDoor(settings).client(), bundle)
    if result.status == "inconclusive":
        raise BadInput(f"{report_json.parent / replay_stage.bundle_file(name)}: {result.reason}")
    ran = replay_stage.SUMMARY.validate_python({**result.evidence.as_dict(), "image": image_id,
                                                "seconds": round(time.monotonic() - started, 1)})
    return replay_stage.verdict(name, summary, ran)


REPORT_FORMATS = ("md", "json", "junit", "ctrf")


def report_text(report_json: Path, fmt: str) -> str:
    """A stored report as Markdown, JSON, JUnit XML or CTRF JSON."""
    if fmt not in REPORT_FORMATS:
        raise BadInput(f"--format: expected md, json, junit, ctrf or html, got {fmt[:40]!r}")
    report = document.load(report_json)
    if fmt == "json":
        return report.model_dump_json(indent=2)
    if fmt == "junit":
        return document.to_junit(report)
    if fmt == "ctrf":
        return json.dumps(to_ctrf(report), indent=2)
    return document.to_markdown(report)


def report_html(report_json: Path) -> str:
    """A stored report as one self-contained HTML page (the templates of the history page)."""
    return report_page.report_html(document.load(report_json))
