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

from builder.core import faults, log
from builder.core import files as fs
from builder.core.constants import MANIFEST
from builder.core.errors import BadInput, BuildFailed, InfraError, NotAccepted, Regression, StaleLock
from builder.core.options import Settings
from builder.core.records import BuiltImage, PublishReceipt, RenderedBuild, Report, ResolvedSources, SqshExport
from builder.engine import client as engine
from builder.engine import infra, platforms, staging
from builder.gating import replay as replay_stage
from builder.gating.plan import Flags, Plan
from builder.image import build as build_stage
from builder.image import context as build_context
from builder.image import render as render_stage
from builder.lock import lockfile
from builder.lock import record as lock_record
from builder.lock.record import Lock
from builder.nightly import compare as compare_mod
from builder.nightly import fleet, follow, notify, page, rundiff
from builder.nightly import gc as housekeeping
from builder.nightly import history as history_mod
from builder.nightly.history import History
from builder.pins import model as pins_model
from builder.pins.model import Pins
from builder.release import attest, dsse, journal, multiarch, rebuild, sqsh, sqsh_place, trust
from builder.release import publish as publish_stage
from builder.release import verify as verify_stage
from builder.report import document
from builder.report import html as report_page
from builder.report.ctrf import to_ctrf
from builder.runners import factory as runners
from builder.runners import sqsh_smoke
from builder.sources import resolve as sources


class _Engine:
    """A use case's one engine client: connected when a stage first needs it (so a refusal before that, a stale
    lock or a bad report, never needs a reachable engine), then passed down to every stage of the use case."""

    def __init__(self, settings: Settings, client: engine.Client | None = None) -> None:
        self.settings, self._client = settings, client

    def client(self) -> engine.Client:
        if self._client is None:
            self._client = engine.connect(self.settings)
        return self._client


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
    pins: nothing is rendered or built from it. A base pinned by an index without base.platform is refused first."""
    platforms.refuse_missing_platform(pins.base.image, pins.base.platform, settings)
    lock = lock_record.of(pins)
    try:
        lockfile.check_fresh(settings, pins, resolved, lock, offline)
    except StaleLock as stale:
        raise stale.as_bad_input() from None
    return lock


def render(pins: Pins, lock: Lock, resolved: ResolvedSources, settings: Settings,
           review: bool = False) -> RenderedBuild:
    """The base resolved to base.platform's manifest (an index without it: exit 2, nothing built), then render.
    `review` (`builder render`, nothing is built): a base its registry cannot serve here is named in one line and
    the Dockerfile names the pinned digest as written."""
    with log.step("render"):
        try:
            base: platforms.BaseManifest | None = platforms.resolve(pins.base.image, pins.base.platform, settings)
        except (BuildFailed, InfraError) as err:
            if not review:
                raise
            log.info(f"base: not read from its registry ({str(err)[:200]}); FROM names the pinned digest")
            base = None
        if base is not None and base.index_digest:
            log.info(f"base: index {base.index_digest} -> {pins.base.platform} manifest {base.digest}")
        return render_stage.render(pins, lock, resolved, settings, base)


def render_pins_only(pins: Pins) -> str:
    """The Dockerfile from the pins alone: nothing fetched, no context, trees unresolved (a review render,
    never built: the lock is read, not checked against the commits)."""
    return render_stage.render_dockerfile(pins, lock_record.of(pins), None)


def build(rendered: RenderedBuild, settings: Settings, nocache: bool = False, quiet: bool = False,
          client: engine.Client | None = None) -> BuiltImage:
    """Build the rendered context on the engine (`client`: the calling use case's; the build use case connects)."""
    with log.step("build"):
        try:
            return build_stage.build(rendered, settings, nocache=nocache, echo=not quiet,
                                     client=_Engine(settings, client).client())
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
    platforms.refuse_missing_platform(pins.base.image, pins.base.platform, settings)  # exit 2 before anything
    with log.step("lock: resolve sources"):
        resolved = sources.resolve(pins, settings, offline=offline, allow_moved_pr=allow_moved_pr)
    return lockfile.lock(pins, resolved, settings, check=check, resolver_name=resolver, build_sdists=build_sdists,
                         offline=offline, upgrade=upgrade, started=started)


def accept(pins: Pins, plan: Plan, settings: Settings) -> Run:
    """Resolve, build unless the plan names an image, accept where the plan says, write the report. A staged plan
    pushes the build by digest to the staging repository and acceptance pulls that digest. One engine client for
    the whole use case. The run directory is made only once there is a report to put in it. The run joins the
    history as a run by hand."""
    done = _accept(pins, plan, settings, _Engine(settings))
    history_mod.record_by_hand(_history(settings), done.report, done.run_dir / "report.json")
    return done


def _accept(pins: Pins, plan: Plan, settings: Settings, door: _Engine) -> Run:
    """accept() on the calling use case's engine client (run, nightly)."""
    settings = settings.for_release(pins.image.repository)  # BUILDER_REGISTRY_* belong to the release's host
    resolved = resolve(pins, settings, plan.offline, plan.allow_moved_pr)
    built = None
    image = plan.acceptance.image
    lock = checked_lock(pins, resolved, settings, plan.offline) if image is None else lock_record.of(pins)
    client = door.client()  # after the lock check: a stale lock is refused (2) with the engine down too
    if image is None:
        built = build(render(pins, lock, resolved, settings), settings, nocache=plan.nocache, client=client)
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
    run_dir = run_directory(plan.out, pins.name, settings)
    paths = document.write(report, run_dir)
    if plan.key is not None:  # publish requires this signature over the acceptance result
        attest.sign_acceptance(report, pins, dsse.load_private(plan.key, settings.key_passphrase), run_dir)
    _print_verdict(report, paths)
    return Run(report, run_dir)


def run(pins: Pins, plan: Plan, settings: Settings) -> Run:
    """Resolve, build, stage by digest, accept the pulled digest, report; publish and export when the plan asks.
    NotAccepted (exit 1) unless ACCEPTED. One engine client for all of it."""
    settings = settings.for_release(pins.image.repository)
    if plan.publish and (plan.key or settings.signing_key):  # an unreadable key (wrong passphrase) stops the run
        attest.signer(plan.key or settings.signing_key, settings.key_passphrase)  # before anything is built
    door = _Engine(settings)
    done = _accept(pins, plan, settings, door)
    log.info("timings: " + json.dumps(log.timings))
    report_json = done.run_dir / "report.json"
    digest = None
    try:
        done.require_accepted(pins.path)
        if plan.publish:
            receipt = publish_report(report_json, settings, key=plan.key, client=door.client())
            log.info(f"published {receipt.repository}@{receipt.digest}")
            digest = receipt.digest
            if plan.export and document.load(report_json).sqsh is None:  # a cluster acceptance placed its .sqsh
                record = export_sqsh(report_json, settings, client=door.client(), key=plan.key)
                log.info(f"tag {record.tag}: registry {record.registry_digest}, .sqsh sha256:{record.sha256}")
    finally:  # the run joins the history as a run by hand, accepted or not, published or not
        history_mod.record_by_hand(_history(settings), document.load(report_json), report_json, digest)
    log.info(f"report: {done.run_dir / 'report.md'}")
    return done


def publish_report(report_json: Path, settings: Settings, image: str | None = None, key: Path | None = None,
                   attest_once: bool = False, sqsh_dir: Path | None = None,
                   client: engine.Client | None = None, nightly: list[str] | None = None) -> PublishReceipt:
    """Promote (or push) the accepted digest, verify what the registry serves, attach attestations (with
    `attest_once`, none when the key attested this digest before). A cluster-accepted report's .sqsh goes
    beside it under the SHA tag (`sqsh_dir`, else acceptance.slurm.publish_dir, else where it was accepted),
    checked before anything is promoted (builder/release/sqsh_place.py). `client`: the calling use case's engine
    client (run, nightly); without one the publish stage connects, after its refusals. `nightly`: tags moved after
    the report's own (builder/release/journal.py keeps them in the intent); the journal goes once all is done."""
    with log.step("publish"):
        report = document.load(report_json)
        settings = settings.for_release(report.repository)
        signing = None  # before any step: exit 2 when unreadable (no key: said where it matters)
        if key or settings.signing_key:
            signing = attest.signer(key or settings.signing_key, settings.key_passphrase)
        checked = trust.check(report, str(report_json))  # the deliberate re-read of the pins and the lock
        pins, lock = checked if checked else (None, None)
        pinned = pins.acceptance.slurm.publish_dir if pins and pins.acceptance.slurm else None
        where = sqsh_dir or (Path(pinned) if pinned else None)
        copy = sqsh_place.prepare(report, str(report_json), settings, where)
        if copy is None and sqsh_dir is not None:
            raise BadInput(f"--sqsh-dir: {report_json} was accepted by Docker gates; its .sqsh comes from export-sqsh")
        try:
            receipt = publish_stage.publish(report, report_json, pins, lock, settings, image=image, signing_key=key,
                                            attest_once=attest_once, client=client, nightly=nightly,
                                            sqsh=copy.journal() if copy is not None else None)
            if copy is not None:
                faults.point("publish: sqsh")
                sqsh_place.place(copy, document.load(report_json), report_json, receipt)
                if signing is not None:  # sqsh_smoke's own signed test result, made at placement
                    attest.sign_placement(document.load(report_json), signing, report_json.parent)
            journal.remove(report.repository, settings)  # the receipt, the .sqsh and the nightly tags are done
        finally:
            if copy is not None:
                copy.discard()
        return receipt


def publish_index(report_jsons: list[Path], settings: Settings, key: Path | None = None) -> str:
    """Several ACCEPTED per-platform reports of one release as one OCI index (builder/release/multiarch.py):
    members by digest, the index, attestations, then the tags; returns `repository@<index digest>`."""
    with log.step(f"publish index of {len(report_jsons)} platforms"):
        return multiarch.publish_index(report_jsons, settings, signing_key=key)


def export_sqsh(report_json: Path, settings: Settings, out: Path | None = None,
                squash_options: str | None = None, smoke: bool = True,
                client: engine.Client | None = None, key: Path | None = None) -> SqshExport:
    """The accepted image as an enroot .sqsh, checked file by file and (unless `smoke` is off) smoked, recorded
    in the report. `client`: the calling use case's engine client (run); without one the export stage connects,
    after its refusals (not accepted, a bad --out, not root) and only when the export is not cached. With a key
    (`key`, else BUILDER_SIGNING_KEY) the smoke's test result is signed beside the report (placement.dsse.json)."""
    with log.step("export .sqsh"):
        report = document.load(report_json)
        settings = settings.for_release(report.repository)
        signing = attest.signer(key or settings.signing_key, settings.key_passphrase) \
            if key or settings.signing_key else None
        checked = trust.check(report, str(report_json))
        pins = checked[0] if checked else None
        record = sqsh.export(report, report_json, pins, settings, out=out, client=client,
                             squash_options=squash_options,
                             smoke=sqsh_smoke.provenance_on_rootfs if smoke else None)
        if signing is not None:
            attest.sign_placement(document.load(report_json), signing, report_json.parent)
        return record


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
        result, image_id = runners.replay(plan, pins, target, settings, _Engine(settings).client(), bundle)
    if result.status == "inconclusive":
        raise BadInput(f"{report_json.parent / replay_stage.bundle_file(name)}: {result.reason}")
    ran = {**result.evidence.as_dict(), "image": image_id, "seconds": round(time.monotonic() - started, 1)}
    return replay_stage.verdict(name, summary, ran)


def rebuild_check(report_json: Path, settings: Settings) -> dict[str, Any]:
    """Rebuild the report's pins with no cache under a separate tag and compare digests; the result is
    written into the report. NotAccepted (exit 1) when the digests differ."""
    report = document.load(report_json)
    settings = settings.for_release(report.repository)
    rebuild.recorded_digest(report, report_json)
    pins = load_pins(Path(report.sources.pins_path))
    resolved = resolve(pins, settings)
    rendered = render(pins, checked_lock(pins, resolved, settings), resolved, settings)
    rendered = rendered.model_copy(update={"tag": rebuild.rebuild_tag(rendered.tag)})
    client = _Engine(settings).client()
    with log.step("rebuild --nocache"):
        try:
            built = build_stage.build(rendered, settings, nocache=True, echo=False, client=client)
        finally:
            build_context.build_ended(Path(rendered.context_path))
    result = rebuild.record(report, report_json, built, build_stage.local_tag(rendered, settings), settings, client)
    if result["status"] != "same":
        raise NotAccepted(f"{report_json}: rebuild gives {result['rebuild']['manifest_digest']}, the report has "
                          f"{result['report']['manifest_digest']}; diff in {report_json}")
    log.info(f"reproduced {result['report']['manifest_digest']}")
    return result


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
    history = history or History(settings.cache("history") / "runs.sqlite")
    previous = follow.previous(history, pins.name)
    door = _Engine(settings)  # one engine client: acceptance, the image's manifest, publish
    done = _accept(pins, replace(plan, acceptance=replace(plan.acceptance, stage=True)), settings, door)
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
    return housekeeping.gc(settings, older_than_s=older_than_s, keep_runs=keep_runs, client=_Engine(settings).client())


def nightly_fleet(pins_paths: list[Path], flags: Flags, settings: Settings, jobs: int | None) -> int:
    """Several pins files as a fleet: one `builder nightly` process each, at most `jobs` at once (default 1;
    with --slurm all at once: each submits its gates and the cluster schedules them); returns the most
    severe of their exit codes (core/errors.py SEVERITY)."""
    argv = [*(["--follow-prs"] if flags.follow_prs else []), *(["--publish"] if flags.publish else []),
            *(["--key", str(flags.key)] if flags.key else []), *(["--slurm"] if flags.slurm else [])]
    parallel = jobs or (min(len(pins_paths), fleet.MAX_JOBS) if flags.slurm else 1)
    outcomes = fleet.run_fleet(fleet.plan(pins_paths, flags.out, settings), parallel, argv)
    return fleet.severest([o.code for o in outcomes])


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


def keygen(private: Path, public: Path | None = None, kind: str = "ed25519",
           passphrase: str | None = None) -> tuple[Path, str]:
    """An ed25519 or P-256 key pair (private mode 0600, encrypted with a passphrase); returns (public key path, key ID)."""
    public = public or private.with_name(private.name + ".pub")
    return public, dsse.keygen(private, public, kind, passphrase)


def verify(reference: str, keys: list[Path], settings: Settings, require_all_keys: bool = False,
           platform: str | None = None) -> verify_stage.Outcome:
    """What the trusted keys signed for REPOSITORY@sha256:...; AttestationError naming the first failed check.
    `platform`: the reference is a multi-arch index; its member for that platform is verified (multiarch.py)."""
    publics = [dsse.load_public(k) for k in keys]
    settings = settings.for_release(reference)  # BUILDER_REGISTRY_* belong to the reference's host
    if platform is not None:
        return multiarch.verify_platform(reference, platform, publics, settings, require_all_keys)
    return verify_stage.verify(reference, publics, settings, require_all_keys=require_all_keys)


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


# ---------------------------------------------------------------- the nightly as a page: history, compare, notify


def history_page(settings: Settings, names: list[str] | None = None, last: int = page.DEFAULT_LAST,
                 out: Path | None = None, history: History | None = None) -> Path:
    """The nightly history page (builder/nightly/page.py) of these pins names (default: every name in the history),
    the last `last` nights of each, written to `out` (default: history.html beside the history's rows)."""
    if last < 1:
        raise BadInput(f"--last: expected at least 1 night, got {last}")
    history = history or _history(settings)
    path = out or history.path.parent / page.PAGE
    with log.step("history page"):
        page.write(page.render(history, settings, names, last), path)
    return path


COMPARE_FORMATS = ("md", "json", "html")


def compare(a: str, b: str, settings: Settings, fmt: str = "md", history: History | None = None) -> str:
    """What moved from report A to report B (A may be `last-accepted`: the newest accepted run of B's pins name
    before B): commits, lock lines, layers, gate evidence, the throughput against the gate's noise; as Markdown,
    JSON or one HTML page."""
    if fmt not in COMPARE_FORMATS:
        raise BadInput(f"--format: expected md, json or html, got {fmt[:40]!r}")
    (old, old_path), (new, new_path) = compare_mod.load_pair(a, b, history or _history(settings))
    diff = compare_mod.compare(old, new, old_path, new_path, settings)
    if fmt == "json":
        return json.dumps(diff, indent=2, sort_keys=True)
    return compare_mod.to_html(diff) if fmt == "html" else compare_mod.to_markdown(diff)


def report_html(report_json: Path) -> str:
    """A stored report as one self-contained HTML page (the templates of the history page)."""
    return report_page.report_html(document.load(report_json))


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


def _history(settings: Settings) -> History:
    return History(settings.cache("history") / "runs.sqlite")


# ---------------------------------------------------------------- bisect: the first bad commit between two runs


def bisect(good_path: Path, bad_path: Path, settings: Settings, flags: Flags, json_path: Path | None = None,
           max_steps: int | None = None) -> dict[str, Any]:
    """`builder bisect GOOD BAD` (builder/bisect/): each candidate built from BAD's pins with only the commits
    changed, under this bisect's local names (builder-run/<run id>), gated by the gates that failed in BAD (or
    `flags.gates`), and removed at the end. The state file in the bisect directory makes a rerun resume."""
    import hashlib  # lazy: only bisect needs it

    from builder.bisect import answer as answers  # lazy: only bisect needs it
    from builder.bisect import session, sides  # lazy: only bisect needs it
    from builder.bisect.search import Step, gated  # lazy: only bisect needs it
    from builder.core.errors import BuildFailed  # lazy: only bisect needs it
    from builder.gating.plan import make as make_plan  # lazy: only bisect needs it
    from builder.sources import mirror  # lazy: only bisect needs it

    good, bad = sides.load(good_path, "GOOD"), sides.load(bad_path, "BAD")
    key = hashlib.sha256(f"{good.label}\n{bad.label}".encode()).hexdigest()[:12]
    out_dir = flags.out or settings.cache("bisect", f"{bad.pins.name}-{key}")
    out_dir.mkdir(parents=True, exist_ok=True)
    state = out_dir / answers.STATE
    run_id = json.loads(state.read_text()).get("run_id", settings.run_id) if state.is_file() else settings.run_id
    settings = replace(settings, run_id=run_id)
    if not state.is_file():  # the run id from the start: `builder gc` spares the directory while it is live
        answers.save_state(state, good.label, bad.label, run_id, [])
    door, gates, exported = _Engine(settings), list(flags.gates), list[Path]()
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
    from builder.bisect import sides  # lazy: only bisect needs it

    return sides.night(_history(settings), name, night, which)


def _night_is_bad_step(good: Path, run_dir: Path, flipped: list[str], out: Path, run_id: str) -> None:
    """The night's own run is the bisection's BAD check (the same commits, just accepted: its flipped gates
    failed), written as the state file's first step: BAD is not built and gated again."""
    from builder.bisect import answer as answers  # lazy: only nightly --bisect needs it
    from builder.bisect.search import Step  # lazy: only nightly --bisect needs it

    night = document.load(run_dir / "report.json")
    first = next(g for g in night.gates if g.name == flipped[0])
    step = Step({n: c.commit for n, c in night.sources.components.items()}, "bad", "BAD", gate=first.name,
                reason=first.reason, run_dir=str(run_dir), failed=flipped)
    out.mkdir(parents=True, exist_ok=True)
    answers.save_state(out / answers.STATE, str(good), str(run_dir / "report.json"), run_id, [step])
    log.info(f"nightly --bisect: BAD is this night's run ({first.name} failed): not built again")


def _nightly_bisect(history: History, name: str, run_dir: Path, settings: Settings, plan: Plan) -> str:
    """`nightly --bisect`: bisect from the last accepted night to this one over the gates that flipped from pass
    to fail (into bisect/ beside the report); what it names, for the page and the message. A bisect that cannot
    run or ends without an answer is one line: the nightly's verdict and exit code stand."""
    from builder.core.errors import BuilderError  # lazy: only nightly --bisect needs it

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
    _night_is_bad_step(Path(last.report_path), run_dir, flipped, run_dir / page.BISECT, f"{settings.run_id}-bisect")
    try:
        answer = bisect(Path(last.report_path), run_dir / "report.json", settings, flags)
    except BuilderError as exc:
        log.info(f"nightly --bisect: {exc.headline()}; the verdict stands")
        return ""
    first = answer.get("first_bad")
    if first:
        return f"{first['component']} {first['commit'][:12]} (PR #{first['pr']}) {first['subject']}: {first['gate']}"
    return "one of " + ", ".join(c[:12] for c in answer.get("range", []))
