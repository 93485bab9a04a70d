"""The backbone: each use case (lock, run, accept, publish, export-sqsh, rebuild, nightly) as one plain
function over typed records. The CLI parses arguments and calls these; nightly and rebuild call the
same functions. Each use case reads the pins file and its lock once and passes `(Pins, Lock)` down;
render, build and run first check that the lock fits the pins (`checked_lock`). Publish and export read
both again through `release.trust`, on purpose (publish believes the files, checked against the sha256s
the report recorded, not the report).

    pins.load -> sources.resolve -> image.render -> image.build -> engine.staging.push
      -> accept.gates -> report.document -> release.publish (-> attest) -> release.sqsh
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from builder.accept import gates
from builder.accept import replay as replay_stage
from builder.cluster import accept as cluster
from builder.core import files as fs
from builder.core import log
from builder.core.constants import MANIFEST
from builder.core.errors import BadInput, NotAccepted, Regression, StaleLock
from builder.core.imageref import by_digest
from builder.core.options import Settings
from builder.core.records import BuiltImage, PublishReceipt, RenderedBuild, Report, ResolvedSources, SqshExport
from builder.engine import client as engine
from builder.engine import infra, staging
from builder.image import build as build_stage
from builder.image import context as build_context
from builder.image import render as render_stage
from builder.lock import lockfile
from builder.lock import record as lock_record
from builder.lock.record import Lock
from builder.nightly import fleet, follow, rundiff
from builder.nightly import gc as housekeeping
from builder.nightly.history import History
from builder.pins import model as pins_model
from builder.pins.model import Pins
from builder.release import attest, dsse, rebuild, sqsh, sqsh_place, trust
from builder.release import publish as publish_stage
from builder.release import verify as verify_stage
from builder.report import document
from builder.report.ctrf import to_ctrf
from builder.sources import resolve as sources


@dataclass(frozen=True)
class Run:
    """What an accept or run use case leaves behind: the report and the run directory holding it."""

    report: Report
    run_dir: Path

    def require_accepted(self, pins_path: Path) -> None:
        """NotAccepted (exit 1) naming the report, unless the verdict is ACCEPTED."""
        if self.report.verdict != "ACCEPTED":
            raise NotAccepted(f"{pins_path}: image {self.report.image_id} not accepted; see {self.run_dir / 'report.md'}")


def setup(settings: Settings) -> dict[str, Any]:
    """Start the Docker engine (network none) and the local registry, if not running."""
    with log.step("setup engine and registry"):
        return infra.ensure_all(settings)


def load_pins(path: Path) -> Pins:
    with log.step("load pins"):
        return pins_model.load(path)


def pins_schema() -> str:
    """The JSON Schema of pins files (builder/pins/schema/pins.schema.json is this text)."""
    return pins_model.schema_json()


def resolve(pins: Pins, settings: Settings, offline: bool = False, allow_moved_pr: bool = False) -> ResolvedSources:
    with log.step("resolve sources"):
        resolved = sources.resolve(pins, settings, offline=offline, allow_moved_pr=allow_moved_pr)
    log.info(sources.format_table(resolved))
    return resolved


def checked_lock(pins: Pins, resolved: ResolvedSources, settings: Settings, offline: bool = False) -> Lock:
    """The pins' lock, read once; BadInput (exit 2, the line `lock --check` prints) when it is stale for the
    pins: nothing is rendered or built from it."""
    lock = lock_record.of(pins)
    try:
        lockfile.check_fresh(settings, pins, resolved, lock, offline)
    except StaleLock as stale:
        raise stale.as_bad_input() from None
    return lock


def render(pins: Pins, lock: Lock, resolved: ResolvedSources, settings: Settings) -> RenderedBuild:
    with log.step("render"):
        return render_stage.render(pins, lock, resolved, settings)


def render_pins_only(pins: Pins) -> str:
    """The Dockerfile from the pins alone: nothing fetched, no context, trees unresolved (a review render,
    never built: the lock is read, not checked against the commits)."""
    return render_stage.render_dockerfile(pins, lock_record.of(pins), None)


def build(rendered: RenderedBuild, settings: Settings, nocache: bool = False, quiet: bool = False) -> BuiltImage:
    with log.step("build"):
        try:
            return build_stage.build(rendered, settings, nocache=nocache, echo=not quiet)
        finally:  # a rebuild renders again; the Dockerfile, context.sha256 and the log stay
            build_context.build_ended(Path(rendered.context_path))


def lock(pins_path: Path, settings: Settings, check: bool = False, offline: bool = False, resolver: str = "uv",
         build_sdists: bool = False, allow_moved_pr: bool = False, upgrade: bool = False) -> lockfile.LockResult:
    """Write (or with `check`, verify) the pins' lock and fill the wheelhouse (`upgrade`: resolve again
    even when the inputs are unchanged)."""
    started = time.monotonic()
    lockfile.check_resolver(resolver)
    if not check:
        lockfile.start_lock_file(pins_path)
    pins = load_pins(pins_path)
    with log.step("lock: resolve sources"):
        resolved = sources.resolve(pins, settings, offline=offline, allow_moved_pr=allow_moved_pr)
    return lockfile.lock(pins, resolved, settings, check=check, resolver_name=resolver, build_sdists=build_sdists,
                         offline=offline, upgrade=upgrade, started=started)


def accept(pins: Pins, settings: Settings, image: str | None = None, gate_names: list[str] | None = None,
           offline: bool = False, allow_moved_pr: bool = False, out: Path | None = None, timeout: int | None = None,
           engine_url: str | None = None, stage: bool = False, nocache: bool = False,
           key: Path | None = None, slurm: dict[str, Any] | None = None) -> Run:
    """Resolve, build unless an image is given, accept, write the report. With `stage` (or an engine URL)
    the build is pushed by digest to the staging repository and acceptance pulls that digest. With `slurm`
    (the --slurm flags) the candidate goes to .sqsh on shared storage and its gates run as Slurm steps. The
    run directory is made only once there is a report to put in it."""
    if slurm is not None and (engine_url or pins.acceptance.engine):
        raise BadInput("--slurm: expected no --engine / acceptance.engine (the gates run on the cluster)")
    resolved = resolve(pins, settings, offline, allow_moved_pr)
    engine_url = engine_url or pins.acceptance.engine
    built = None
    lock = checked_lock(pins, resolved, settings, offline) if image is None else lock_record.of(pins)
    if image is None:
        built = build(render(pins, lock, resolved, settings), settings, nocache=nocache)
        image = built.image_id
        if stage or engine_url:
            repo = staging.staging_repository(pins.image.repository, pins.image.staging)
            built.staged = image = staging.push(built.manifest_digest, repo, pins.base.name, settings)
    with log.step("acceptance"):
        staged = by_digest(image)
        if slurm is not None:
            result = cluster.accept_on_slurm(pins, image, settings, cluster.options(pins, settings, slurm),
                                             gate_names or None, timeout, built.image_id if built else None)
        elif staged is not None:
            result = gates.accept_staged(staged, pins, built.image_id if built else None, engine_url,
                                         gate_names or None, timeout, settings)
        elif engine_url:
            raise BadInput("--engine: expected --image REPOSITORY@sha256:<digest> (another engine pulls by digest)")
        else:
            result = gates.accept(image, pins, settings, gates=gate_names or None, timeout_s=timeout)
    there = replace(settings, docker_host=engine_url) if engine_url else settings
    report = document.make_report(pins, lock, resolved, built, result, image_manifest=image_manifest(there, result.image_id))
    run_dir = run_directory(out, pins.name, settings)
    paths = document.write(report, run_dir)
    key = key or settings.signing_key
    if key is not None:  # publish requires this signature over the acceptance result
        attest.sign_acceptance(report, pins, dsse.load_private(key), run_dir)
    _print_verdict(report, paths)
    return Run(report, run_dir)


def run(pins: Pins, settings: Settings, publish: bool = False, export: bool = False, offline: bool = False,
        allow_moved_pr: bool = False, out: Path | None = None, key: Path | None = None,
        engine_url: str | None = None, nocache: bool = False, slurm: dict[str, Any] | None = None) -> Run:
    """Resolve, build, stage by digest, accept the pulled digest, report; publish and export when asked.
    NotAccepted (exit 1) unless ACCEPTED."""
    if export and not publish:
        raise BadInput("--sqsh: expected --publish too (the .sqsh is recorded beside the registry digest)")
    done = accept(pins, settings, offline=offline, allow_moved_pr=allow_moved_pr, out=out, engine_url=engine_url,
                  stage=True, nocache=nocache, key=key, slurm=slurm)
    log.info("timings: " + json.dumps(log.timings))
    report_json = done.run_dir / "report.json"
    done.require_accepted(pins.path)
    if publish:
        receipt = publish_report(report_json, settings, key=key)
        log.info(f"published {receipt.repository}@{receipt.digest}")
    if export and slurm is None:  # accepted on the cluster: publish placed the .sqsh the gates ran on
        record = export_sqsh(report_json, settings)
        log.info(f"tag {record.tag}: registry {record.registry_digest}, .sqsh sha256:{record.sha256}")
    log.info(f"report: {done.run_dir / 'report.md'}")
    return done


def publish_report(report_json: Path, settings: Settings, image: str | None = None, key: Path | None = None,
                   attest_once: bool = False, sqsh_dir: Path | None = None) -> PublishReceipt:
    """Promote (or push) the accepted digest, verify what the registry serves, attach attestations (with
    `attest_once`, none when the key attested this digest before). A cluster-accepted report's .sqsh goes
    beside it under the SHA tag (`sqsh_dir`, else acceptance.slurm.publish_dir, else where it was accepted),
    checked before anything is promoted (builder/release/sqsh_place.py)."""
    with log.step("publish"):
        report = document.load(report_json)
        checked = trust.check(report, str(report_json))  # the deliberate re-read of the pins and the lock
        pins, lock = checked if checked else (None, None)
        pinned = pins.acceptance.slurm.publish_dir if pins and pins.acceptance.slurm else None
        where = sqsh_dir or (Path(pinned) if pinned else None)
        copy = sqsh_place.prepare(report, str(report_json), settings, where)
        if copy is None and sqsh_dir is not None:
            raise BadInput(f"--sqsh-dir: {report_json} was accepted by Docker gates; its .sqsh comes from export-sqsh")
        try:
            receipt = publish_stage.publish(report, report_json, pins, lock, settings, image=image, signing_key=key,
                                            attest_once=attest_once)
            if copy is not None:
                sqsh_place.place(copy, document.load(report_json), report_json, receipt)
        finally:
            if copy is not None:
                copy.discard()
        return receipt


def export_sqsh(report_json: Path, settings: Settings, out: Path | None = None,
                squash_options: str | None = None, smoke: bool = True) -> SqshExport:
    """The accepted image as an enroot .sqsh, checked file by file and (unless `smoke` is off) smoked, recorded
    in the report."""
    with log.step("export .sqsh"):
        report = document.load(report_json)
        checked = trust.check(report, str(report_json))
        pins = checked[0] if checked else None
        return sqsh.export(report, report_json, pins, settings, out=out, squash_options=squash_options, smoke=smoke)


def replay(report_json: Path, settings: Settings, gate: str | None = None,
           image: str | None = None) -> tuple[list[str], bool]:
    """Run one gate's replay bundle (replay/<gate>.json beside the report) again in a fresh container of the
    report's image or `image`: (lines to print, whether the sides still differ). A bundle from a gate that saw
    no difference prints that there is nothing to replay (not differing); no bundle at all is BadInput."""
    report = document.load(report_json)
    name, summary = replay_stage.choose(report.gates, gate, str(report_json))
    if not summary.get("differs"):
        return [f"{name}: {summary.get('note') or 'nothing to replay: the gate saw no difference'}"], False
    bundle = replay_stage.load_bundle(report_json.parent, name)
    target = image or report.image_id
    with log.step(f"replay {name} on {target}"):
        result = replay_stage.run(engine.connect(settings), target, str(summary.get("python")), bundle)
    if result.get("error"):
        raise BadInput(f"{report_json.parent / replay_stage.bundle_file(name)}: {result['error']}")
    return replay_stage.lines(name, result), bool(result.get("differs"))


def rebuild_check(report_json: Path, settings: Settings) -> dict[str, Any]:
    """Rebuild the report's pins with no cache under a separate tag and compare digests; the result is
    written into the report. NotAccepted (exit 1) when the digests differ."""
    report = document.load(report_json)
    rebuild.recorded_digest(report, report_json)
    pins = load_pins(Path(report.sources.pins_path))
    resolved = resolve(pins, settings)
    rendered = render(pins, checked_lock(pins, resolved, settings), resolved, settings)
    rendered = rendered.model_copy(update={"tag": rebuild.rebuild_tag(rendered.tag)})
    with log.step("rebuild --nocache"):
        try:
            built = build_stage.build(rendered, settings, nocache=True, echo=False)
        finally:
            build_context.build_ended(Path(rendered.context_path))
    result = rebuild.record(report, report_json, built, build_stage.local_tag(rendered, settings), settings)
    if result["status"] != "same":
        raise NotAccepted(f"{report_json}: rebuild gives {result['rebuild']['manifest_digest']}, the report has "
                          f"{result['report']['manifest_digest']}; diff in {report_json}")
    log.info(f"reproduced {result['report']['manifest_digest']}")
    return result


def nightly(pins: Pins, settings: Settings, follow_prs: bool = False, publish: bool = False,
            out: Path | None = None, key: Path | None = None, history: History | None = None,
            today: str | None = None, slurm: dict[str, Any] | None = None) -> Run:
    """Follow PR heads (when asked), run, diff with the last accepted run of the same pins name, move the
    nightly tags. NotAccepted (1) when not accepted, Regression (4) when accepted with a regression flag.
    `slurm`: the --slurm flags (the gates run on the cluster, as `accept --slurm`)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    pins_path = pins.path
    moved: list[dict[str, Any]] = []
    if follow_prs:
        with log.step("follow PR heads"):
            pins, moved = follow.follow_prs(pins, settings)
        log.info(f"moved: {len(moved)} component(s)" if moved else "no PR head moved")
    history = history or History(settings.cache("history") / "runs.sqlite")
    previous = follow.previous(history, pins.name)
    done = accept(pins, settings, out=out, stage=True, key=key, slurm=slurm)
    report, run_dir = done.report, done.run_dir
    manifest = image_manifest(settings, report.image_id)
    fs.write_atomic(run_dir / "image-manifest.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    accepted = report.verdict == "ACCEPTED"
    digest, tags = None, None
    if accepted and publish:
        receipt = publish_report(run_dir / "report.json", settings, key=key, attest_once=True)  # never re-attest
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
                {n: c.commit for n, c in report.sources.components.items()}, run_dir / "report.json", code, flag)
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
    return housekeeping.gc(settings, older_than_s=older_than_s, keep_runs=keep_runs)


def nightly_fleet(pins_paths: list[Path], settings: Settings, jobs: int | None, follow_prs: bool = False,
                  publish: bool = False, out: Path | None = None, key: Path | None = None,
                  slurm: dict[str, Any] | None = None) -> int:
    """Several pins files as a fleet: one `builder nightly` process each, at most `jobs` at once (default 1;
    with `slurm` flags all at once: each submits its gates and the cluster schedules them); returns the most
    severe of their exit codes (core/errors.py SEVERITY)."""
    flags = [*(["--follow-prs"] if follow_prs else []), *(["--publish"] if publish else []),
             *(["--key", str(key)] if key else []), *fleet.slurm_argv(slurm)]
    parallel = jobs or (min(len(pins_paths), fleet.MAX_JOBS) if slurm is not None else 1)
    outcomes = fleet.run_fleet(fleet.plan(pins_paths, out, settings), parallel, flags)
    return fleet.severest([o.code for o in outcomes])


REPORT_FORMATS = ("md", "json", "junit", "ctrf")


def report_text(report_json: Path, fmt: str) -> str:
    """A stored report as Markdown, JSON, JUnit XML or CTRF JSON."""
    if fmt not in REPORT_FORMATS:
        raise BadInput(f"--format: expected md, json, junit or ctrf, got {fmt[:40]!r}")
    report = document.load(report_json)
    if fmt == "json":
        return report.model_dump_json(indent=2)
    if fmt == "junit":
        return document.to_junit(report)
    if fmt == "ctrf":
        return json.dumps(to_ctrf(report), indent=2)
    return document.to_markdown(report)


def keygen(private: Path, public: Path | None = None) -> tuple[Path, str]:
    """An ed25519 key pair (private mode 0600); returns (public key path, key ID)."""
    public = public or private.with_name(private.name + ".pub")
    return public, dsse.keygen(private, public)


def verify(reference: str, keys: list[Path], settings: Settings, require_all_keys: bool = False) -> verify_stage.Outcome:
    """What the trusted keys signed for REPOSITORY@sha256:...; AttestationError naming the first failed check."""
    publics = [dsse.load_public(k) for k in keys]
    return verify_stage.verify(reference, publics, settings, require_all_keys=require_all_keys)


def image_manifest(settings: Settings, image_id: str) -> dict[str, Any] | None:
    """/opt/delivery/manifest.json of the image, for the report's run manifest."""
    data = engine.read_file(engine.connect(settings), image_id, MANIFEST)
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
