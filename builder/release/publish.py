"""Publish exactly the accepted image: tag, push, then verify what the registry serves.

Refuses a report that is not ACCEPTED, a report whose gates do not support its verdict, and a
report for another image than the local one.  A receipt is written into the report only after every
tag serves the manifest the push reported, whose config digest is our image ID.  Credentials come from
BUILDER_REGISTRY_USERNAME / BUILDER_REGISTRY_PASSWORD (or `credentials`) and are masked in every message.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from builder.core import files as fs
from builder.core import log
from builder.core.constants import MANIFEST
from builder.core.errors import PublishError
from builder.core.imageref import ImageRef
from builder.core.options import Settings
from builder.core.records import PublishReceipt, Report
from builder.engine import client as engine
from builder.engine import staging
from builder.engine.client import Client
from builder.engine.registry import Registry, mask, split_repository, verify_tag
from builder.lock.record import Lock
from builder.pins.model import Pins
from builder.release import attest, trust
from builder.report import document as report_mod


def check_accepted(report: Report, where: str) -> None:
    """The verdict must be ACCEPTED and every required gate must read pass in the report itself."""
    if report.verdict != "ACCEPTED":
        raise PublishError(f"{where}: verdict is {report.verdict}; only an ACCEPTED image is published")
    status = {g.name: g.status for g in report.gates}
    if report.acceptance is None or not report.required_gates:
        raise PublishError(f"{where}: verdict ACCEPTED without acceptance evidence; refusing")
    for name in report.required_gates:
        if status.get(name) != "pass":
            raise PublishError(f"{where}: required gate {name} reads {status.get(name, 'not run')}, "
                               "not pass; the verdict is inconsistent; refusing")
    if report.acceptance.image_id != report.image_id:
        raise PublishError(f"{where}: acceptance ran on {report.acceptance.image_id}, "
                           f"the report is for {report.image_id}; refusing")


def local_image(client: Client, report: Report, image: str | None, where: str) -> str:
    """The ID of the local image the report accepted, by its ID (a tag may have been moved by a concurrent
    run), or `image`; it must be the one the report accepted."""
    ref = image or report.image_id
    found = engine.image_id(client, ref)
    if found is None:
        raise PublishError(f"{where}: no local image {ref}; build it or pass the image ID")
    if found != report.image_id:
        raise PublishError(f"{where}: local image {ref} is {found}, the report accepted {report.image_id}; refusing")
    return found


def _push(client: Client, repository: str, tag: str, auth: tuple[str, str] | None, secrets: list[str]) -> str:
    """Push one tag; return the digest the engine reported.  Any error -> PublishError."""
    digest, errors = "", []  # type: str, list[str]
    try:
        for item in engine.push(client, repository, tag, auth):
            if "error" in item or "errorDetail" in item:
                errors.append(item.get("error") or (item.get("errorDetail") or {}).get("message", "error"))
            aux = item.get("aux") or {}
            if aux.get("Tag") == tag and aux.get("Digest"):
                digest = aux["Digest"]
    except Exception as exc:  # the engine's refusal or a lost connection while streaming
        raise PublishError(mask(f"push {repository}:{tag}: {type(exc).__name__}: {exc}", secrets)) from None
    if errors:
        raise PublishError(mask(f"push {repository}:{tag}: {errors[-1]}", secrets))
    if not digest:
        raise PublishError(f"push {repository}:{tag}: the engine reported no manifest digest")
    return digest


def publish(report: Report, report_path: Path, pins: Pins | None, lock: Lock | None, settings: Settings,
            image: str | None = None, signing_key: Path | None = None, attest_once: bool = False,
            client: Client | None = None) -> PublishReceipt:
    """Give the accepted digest of an ACCEPTED report its release tags (promote from staging, or push the
    accepted local image), verify it through the registry API, attach signed attestations (only those the key
    has not attached already; with `attest_once`, none when it attested the digest before), record the receipt.
    `pins`, `lock`: what `trust.check` re-read and checked against the report (the caller runs it first);
    `client`: the calling use case's engine client (run, nightly); without one, publish connects once its refusals
    (report, signature, registry) are behind it."""
    where = str(report_path)
    check_accepted(report, where)
    if pins is None or lock is None:
        raise PublishError(f"{where}: no pins and lock checked against the report; refusing")
    if not report.tags or report.repository == report_mod.UNKNOWN:
        raise PublishError(f"{where}: the report names no repository or tags")
    auth = settings.registry_auth
    secrets = [auth[1]] if auth else []
    host, name = split_repository(report.repository)
    registry = Registry.from_settings(host, settings)
    registry.ping()  # InfraError (exit 3) when unreachable, before anything is tagged
    key = attest.signer(signing_key or settings.signing_key)
    check_signed_acceptance(report, report_path, key, where)
    staged = staging.accepted_ref(report, where)
    client = client or engine.connect(settings)  # `builder publish` itself: its one connect, after the refusals
    with staging.repository_lock(report.repository, settings):  # concurrent runs of equal pins take turns
        served_before = {registry.tag_digest(name, tag) for tag in report.tags} - {None}
        before = staging.snapshot(registry, name, report.tags) if staged else {}
        existed = staged is not None and registry.tag_digest(name, str(staged.digest)) is not None
        pushed: dict[str, str] = {}
        try:
            if staged:  # promote: the accepted digest gets the tags (blob mount + manifest PUT); all or nothing
                with log.step(f"promote {staged} -> {report.repository}"):
                    staging.promote(staged, report.image_id, report.repository, report.tags, settings, pushed)
            else:  # accepted on a local image ID: the engine pushes that image
                _push_local(client, report, image, where, auth, secrets, registry, pushed)
            facts = [verify_tag(registry, name, tag, pushed[tag], report.image_id, report.platform)
                     for tag in report.tags]
            digests = sorted({f["digest"] for f in facts})
            if len(digests) != 1:
                raise PublishError(f"{report.repository}: tags {', '.join(report.tags)} serve different digests {digests}")
            with log.step(f"attest {report.repository}@{digests[0][:19]}"):
                attestations = attest_published(report, pins, lock, client, registry, digests[0], key,
                                                attest_once)
        except BaseException as err:
            if staged and pushed:  # promote finished, a later step did not: the tags go back (when reachable)
                staging.rollback(registry, report.repository, {t: before[t] for t in pushed},
                                 str(staged.digest), existed)
            elif isinstance(err, PublishError):
                withdraw(registry, name, set(pushed.values()) - served_before)
            raise
    receipt = PublishReceipt(repository=ImageRef(report.repository), tags=list(report.tags), digest=digests[0],
                             config_digest=facts[0]["config_digest"], verified=True, platform=facts[0]["platform"],
                             pushed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), attestations=attestations)
    record_receipt(report, receipt, report_path)
    log.info(f"published {receipt.repository}@{receipt.digest} (config {receipt.config_digest}, "
             f"{receipt.platform}); verified")
    return receipt


def check_signed_acceptance(report: Report, report_path: Path, key: Ed25519PrivateKey | None,
                            where: str) -> None:
    """With a signing key, the acceptance result must carry a valid signature by it, over this image, reading
    PASSED and listing every required gate as passed (builder/release/trust.py); an edited report.json cannot pass."""
    if key is None:
        trust.check_signature(report, where, envelope=None, public_key=None, verify=None)
        return
    path = report_path.parent / attest.ACCEPTANCE_ENVELOPE
    try:
        envelope = json.loads(path.read_text())
    except (OSError, ValueError):
        envelope = None
    if not isinstance(envelope, dict):
        raise PublishError(f"{where}: no signed acceptance result {path.name} beside it; accept (or run) with the"
                           " signing key first")
    predicate = trust.check_signature(report, where, envelope, key.public_key(), attest.verify_test_result) or {}
    passed = set(predicate.get("passedTests") or [])
    unsigned = [g for g in report.required_gates if g not in passed]
    if unsigned:
        raise PublishError(f"{where}: required gate(s) {', '.join(unsigned)} are not passed in the signed acceptance"
                           " result; refusing")


def attest_published(report: Report, pins: Pins, lock: Lock, client: Client, registry: Registry, digest: str,
                     key: Ed25519PrivateKey | None, once: bool = False) -> list[str]:
    """Signed attestations for the pushed digest (builder/release/attest.py); none without a key."""
    if key is None:
        return []
    manifest = json.loads(engine.read_file(client, report.image_id, MANIFEST) or b"{}")
    return [d["digest"] for d in attest.attach_all(report, pins, lock, report.repository, digest, manifest, key,
                                                   registry, once=once)]


def _push_local(client: Client, report: Report, image: str | None, where: str, auth: tuple[str, str] | None,
                secrets: list[str], registry: Registry, pushed: dict[str, str]) -> None:
    found = local_image(client, report, image, where)
    for tag in report.tags:
        if not engine.tag(client, found, f"{report.repository}:{tag}"):
            raise PublishError(f"{where}: could not tag {found} as {report.repository}:{tag}")
        with log.step(f"push {report.repository}:{tag}"):
            try:
                pushed[tag] = _push(client, report.repository, tag, auth, secrets)
            except PublishError:
                registry.ping()  # a registry gone meanwhile is InfraError (exit 3), not a refused push
                raise


def withdraw(registry: Registry, name: str, digests: set[str]) -> None:
    """Nothing half-published: delete the manifests this publish added (never one a tag served before)."""
    for digest in sorted(digests):
        gone = registry.delete_manifest(name, digest)
        log.info(f"withdrew {registry.host}/{name}@{digest}" if gone else
                 f"could not withdraw {registry.host}/{name}@{digest}; delete it by hand")


def record_receipt(report: Report, receipt: PublishReceipt, report_path: Path) -> None:
    """Put the receipt into the report and re-render report.json / report.md next to report_path."""
    layers = report.run_manifest
    container = layers.container.model_copy(update={"registry_digest": receipt.digest, "platform": receipt.platform})
    report = report.model_copy(update={"publish": receipt,
                                       "run_manifest": layers.model_copy(update={"container": container})})
    paths = report_mod.write(report, report_path.parent)
    if paths["json"].resolve() != report_path.resolve():
        fs.write_atomic(report_path, report.model_dump_json(indent=2) + "\n")
