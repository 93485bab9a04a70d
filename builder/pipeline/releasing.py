"""The release use cases: `builder run` (accept, then publish and export as the plan asks), `publish` (one report,
or several as one index), `export-sqsh`, `rebuild --check`, `keygen`, `verify`. Publish and export read the pins and
the lock again through `release.trust`, on purpose: publish believes the files, checked against the sha256s the
report recorded, not the report.

    accepting -> release.trust -> release.publish (-> attest, sqsh_place) -> release.sqsh (runners.sqsh_smoke)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.core import faults, log
from builder.core.errors import BadInput, NotAccepted
from builder.core.options import Settings
from builder.core.records import PublishReceipt, SqshExport
from builder.engine import client as engine
from builder.gating.plan import Plan
from builder.image import build as build_stage
from builder.image import context as build_context
from builder.nightly import history as history_mod
from builder.nightly.history import open_history
from builder.pins.model import Pins
from builder.pipeline.accepting import Run, accept_on
from builder.pipeline.building import EngineDoor, checked_lock, load_pins, render, resolve
from builder.release import attest, dsse, journal, multiarch, rebuild, sqsh, sqsh_place, trust
from builder.release import publish as publish_stage
from builder.release import verify as verify_stage
from builder.report import document
from builder.runners import sqsh_smoke


def run(pins: Pins, plan: Plan, settings: Settings) -> Run:
    """Resolve, build, stage by digest, accept the pulled digest, report; publish and export when the plan asks.
    NotAccepted (exit 1) unless ACCEPTED. One engine client for all of it."""
    settings = settings.for_release(pins.image.repository)
    if plan.flags.publish and plan.flags.key:  # an unreadable key (wrong passphrase) stops the run
        attest.signer(plan.flags.key, settings.key_passphrase)  # before anything is built
    door = EngineDoor(settings)
    done = accept_on(pins, plan, settings, door)
    log.info("timings: " + json.dumps(log.timings))
    report_json = done.run_dir / "report.json"
    digest = None
    try:
        done.require_accepted(pins.path)
        if plan.flags.publish:
            receipt = publish_report(report_json, settings, key=plan.flags.key, client=door.client())
            log.info(f"published {receipt.repository}@{receipt.digest}")
            digest = receipt.digest
            if plan.flags.export and document.load(report_json).sqsh is None:  # a cluster acceptance placed its .sqsh
                record = export_sqsh(report_json, settings, client=door.client(), key=plan.flags.key)
                log.info(f"tag {record.tag}: registry {record.registry_digest}, .sqsh sha256:{record.sha256}")
    finally:  # the run joins the history as a run by hand, accepted or not, published or not
        history_mod.record_by_hand(open_history(settings), document.load(report_json), report_json, digest)
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
    client = EngineDoor(settings).client()
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
