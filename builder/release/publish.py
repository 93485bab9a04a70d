"""Publish exactly the accepted image by digest through the registry API, then verify what the registry serves.

Refuses a report that is not ACCEPTED, a report whose gates do not support its verdict, and a
report for another image than the local one.  A receipt is written into the report only after every
tag serves the manifest the push reported, whose config digest is our image ID.  Credentials come from
BUILDER_REGISTRY_USERNAME / BUILDER_REGISTRY_PASSWORD (or `credentials`) and are masked in every message.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from builder.core import faults, log
from builder.core import files as fs
from builder.core.errors import InfraError, PublishError
from builder.core.imageref import ImageRef, Repository
from builder.core.options import Settings
from builder.core.records import PublishReceipt, Report
from builder.engine import client as engine
from builder.engine import local_store, staging
from builder.engine.client import Client
from builder.engine.registry import Registry, verify_tag
from builder.lock.record import Lock
from builder.pins.model import Pins
from builder.release import attest, dsse, journal, promote, referrers, sqsh_layout, trust, verify
from builder.release.sqsh_layout import SqshMove
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


def publish(report: Report, report_path: Path, pins: Pins | None, lock: Lock | None, settings: Settings,
            image: str | None = None, signing_key: Path | None = None, attest_once: bool = False,
            client: Client | None = None, sqsh: SqshMove | None = None,
            nightly: list[str] | None = None) -> PublishReceipt:
    """Release the accepted digest of an ACCEPTED report, in one order (docs/release.md): 1. the manifest by digest
    (promoted from staging, or the accepted local image pushed to staging first), verified; 2. with a key, the
    signed attestations attached (only those the key has not attached already; with `attest_once`, none when it
    attested the digest before), read back and verified; 3. the SHA tag; 4. the other tags, then `nightly` tags;
    then the receipt. A journal in the cache (builder/release/journal.py) records the intent before the first
    registry write; the caller removes it (`journal.remove`) once the .sqsh (`sqsh`) is placed.
    `pins`, `lock`: what `trust.check` re-read and checked against the report (the caller runs it first);
    `client`: the calling use case's engine client (run, nightly); without one, publish connects only for a local
    image (a report accepted without staging)."""
    where = str(report_path)
    check_accepted(report, where)
    if pins is None or lock is None:
        raise PublishError(f"{where}: no pins and lock checked against the report; refusing")
    repo = repository_of(report, where)
    registry = Registry.from_settings(repo.host, settings)
    registry.ping()  # InfraError (exit 3) when unreachable, before anything is tagged
    key = attest.signer(signing_key or settings.signing_key, settings.key_passphrase)
    check_signed_acceptance(report, report_path, key, where)
    staged = promote.accepted_ref(report, where)
    local = staged is None  # accepted on a local image ID: release pushes its stored blobs to staging by digest
    with promote.repository_lock(report.repository, settings):  # concurrent runs of equal pins take turns
        journal.recover(repo, settings, registry, receipt_after_kill,
                        lambda left: resume(left, registry, key, settings))
        if staged is None:
            staged = local_ref(client or engine.connect(settings), report, image, where, settings)
        receipt = release(report, report_path, pins, lock, settings, registry, key, staged, attest_once, sqsh,
                          nightly or [], local=local)
    log.info(f"published {receipt.repository}@{receipt.digest} (config {receipt.config_digest}, "
             f"{receipt.platform}); verified")
    return receipt


def resume(left: journal.Journal, registry: Registry, key: dsse.PrivateKey | None, settings: Settings) -> None:
    """Finish a publish killed before its tags (journal recovery, under the repository lock): only with the key that
    was attesting it, its report, and that report's pins and lock still matching their recorded sha256
    (trust.check); PublishError or BadInput names what is missing, and the journal abandons it."""
    if left.media_type == referrers.OCI_INDEX:
        raise PublishError("an index publish: `builder publish` of all its reports finishes it")
    if left.signer and (key is None or dsse.key_id(key.public_key()) != left.signer):
        raise PublishError(f"the key {left.signer[:16]} that was attesting it is not at hand")
    path = Path(left.report)
    if not path.is_file():
        raise PublishError(f"its report {path} is gone")
    report = report_mod.load(path)
    checked = trust.check(report, str(path))  # BadInput when the pins or the lock changed since
    if checked is None:
        raise PublishError(f"{path}: verdict is {report.verdict}")
    accepted = promote.accepted_ref(report, str(path))
    staged = accepted or ImageRef(f"{staging.staging_repository(repository_of(report, str(path)))}@{left.digest}")
    if str(staged.digest) != left.digest:
        raise PublishError(f"{path} now names {staged.digest}")
    check_signed_acceptance(report, path, key if left.signer else None, str(path))
    release(report, path, *checked, settings, registry, key if left.signer else None, staged, False, left.sqsh,
            left.nightly, local=accepted is None)
    if left.sqsh is not None:  # the .sqsh the killed run kept, now its pointer (hashed again first)
        if sqsh_layout.flip(left.sqsh, report.repository, left.digest, report.platform, settings, check=True):
            sqsh_layout.record_in_report(left.sqsh, path)
    journal.remove(report.repository, settings)


def release(report: Report, report_path: Path, pins: Pins, lock: Lock, settings: Settings, registry: Registry,
            key: dsse.PrivateKey | None, staged: ImageRef, attest_once: bool, sqsh: SqshMove | None,
            nightly: list[str], local: bool = False) -> PublishReceipt:
    """The journaled order itself (publish's docstring), under the repository lock, on a checked report. `local`:
    the staged digest's blobs are in the image store (`local_ref`) and go to staging first, journaled too."""
    repo = repository_of(report, str(report_path))
    name = repo.path
    tags = [*report.tags, *(t for t in nightly if t not in report.tags)]
    digest = str(staged.digest)
    plan = journal.Journal(repository=repo, report=str(report_path.absolute()), digest=digest,
                           media_type="", existed=registry.tag_digest(name, digest) is not None, sqsh=sqsh,
                           tags=[journal.TagMove(tag=t, old=registry.tag_digest(name, t), new=digest)
                                 for t in report.tags],
                           nightly=[t for t in tags if t not in report.tags], platform=report.platform,
                           signer=dsse.key_id(key.public_key()) if key else "")
    journal.write(plan, settings)
    moved = False
    try:
        with log.step(f"release {staged} -> {report.repository}@{digest[:19]}"):
            if local:
                push_local(staged, plan, settings)
            manifest, plan.media_type = promote.release_manifest(str(staged), report.image_id, repo, settings)
            facts = verify_tag(registry, name, digest, digest, report.image_id, report.platform)
        plan.phase = "attest"
        journal.write(plan, settings)
        with log.step(f"attest {report.repository}@{digest[:19]}"):
            attestations = attest_published(report, pins, lock, registry, digest, key, attest_once, plan,
                                            settings)
        plan.phase = "tags"
        journal.write(plan, settings)
        moved = True
        with log.step(f"tag {report.repository}: {', '.join(tags)}"):
            # each tag read back before the next moves; a failed read-back rolls every sent tag back
            promote.move_tags(registry, repo, manifest, plan.media_type, tags,
                              check=lambda tag: verify_tag(registry, name, tag, digest, report.image_id,
                                                           report.platform))
    except BaseException:  # Python saw it (SIGTERM included): every tag moved back, the new digest withdrawn
        if not plan.existed:
            withdraw(registry, name, digest, plan.artifacts, tags)
        journal.remove(report.repository, settings)
        raise
    finally:
        if not moved:
            journal.cancel_uploads(registry, plan)
    if sqsh is None:  # a .sqsh pointer of this tag and platform naming another image's file goes
        sqsh_layout.follow(settings, report.repository, report.tags[0], report.platform, digest)
    plan.phase = "receipt"
    journal.write(plan, settings)
    faults.point("publish: receipt")
    receipt = PublishReceipt(repository=repo, tags=list(report.tags), digest=digest,
                             config_digest=facts["config_digest"], verified=True, platform=facts["platform"],
                             pushed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             attestations=attestations)
    record_receipt(report, receipt, report_path)
    return receipt


def receipt_after_kill(report_path: Path, digest: str, tags: list[str], settings: Settings) -> None:
    """The receipt a killed publish did not write, from what the registry serves (journal recovery)."""
    report = report_mod.load(report_path)
    if report.publish is not None and report.publish.digest == digest:
        return
    repo = repository_of(report, str(report_path))
    registry = Registry.from_settings(repo.host, settings)
    facts = verify_tag(registry, repo.path, tags[0], digest, report.image_id, report.platform)
    found = [d["digest"] for d in referrers.discover(registry, repo.path, digest)]
    receipt = PublishReceipt(repository=repo, tags=list(report.tags), digest=digest,
                             config_digest=facts["config_digest"], verified=True, platform=facts["platform"],
                             pushed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), attestations=found)
    record_receipt(report, receipt, report_path)


def repository_of(report: Report, where: str) -> Repository:
    """The repository the report names (parsed as it loaded), and its tags; PublishError when it names none."""
    if not report.tags or not isinstance(report.repository, Repository):
        raise PublishError(f"{where}: the report names no repository or tags")
    return report.repository


def check_signed_acceptance(report: Report, report_path: Path, key: dsse.PrivateKey | None,
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


def attest_published(report: Report, pins: Pins, lock: Lock, registry: Registry, digest: str,
                     key: dsse.PrivateKey | None, once: bool, plan: journal.Journal,
                     settings: Settings) -> list[str]:
    """Signed attestations for the released digest (builder/release/attest.py), read back from the referrers
    index and verified with the key before any tag moves; none without a key. The image's delivery manifest is
    read from the registry's layers (no container)."""
    if key is None:
        return []
    repo = repository_of(report, plan.report)
    name = repo.path
    manifest = verify.image_facts(registry, name, digest)[1]

    def note(kind: str, value: str) -> None:  # the journal learns each upload session and artifact first
        (plan.uploads if kind == "upload" else plan.artifacts).append(value)
        journal.write(plan, settings)

    attached = attest.attach_all(report, pins, lock, repo, digest, manifest, key, registry, once=once,
                                 note=note)
    found = {t for t, _ in attest.attached_by(registry, name, digest, key.public_key()).values()}
    missing = [t for t in attest.PREDICATE_TYPES if t not in found]
    if missing:
        raise PublishError(f"{report.repository}@{digest}: read back, no verified {', '.join(missing)} by the key; "
                           "no tag moved")
    return [d["digest"] for d in attached]


def local_ref(client: Client, report: Report, image: str | None, where: str, settings: Settings) -> ImageRef:
    """Where the accepted local image goes by digest, `<staging repository>@<manifest digest>`, its blobs found or
    saved into the image store (builder/engine/local_store.py); nothing is pushed here and no tag is made."""
    found = local_image(client, report, image, where)
    hint = report.build.manifest_digest if report.build is not None else None
    digest = local_store.manifest_of(client, found, settings, hint or None)
    return ImageRef(f"{staging.staging_repository(repository_of(report, where))}@{digest}")


def push_local(staged: ImageRef, plan: journal.Journal, settings: Settings) -> None:
    """The local image's stored blobs and manifest to staging by digest (the registry API, as a build stages it),
    each upload session in the journal before its PUT; the release then promotes that digest."""
    def session(target: str) -> None:
        plan.uploads.append(target)
        journal.write(plan, settings)
        faults.point("publish: staging upload")

    staging.push(str(staged.digest), Repository.of(staged), None, settings, on_session=session)


def withdraw(registry: Registry, name: str, digest: str, artifacts: list[str], tags: list[str]) -> None:
    """Nothing half-published: delete the manifest this publish added by digest (never one the repository held
    before, never one a tag serves: a rollback that could not reach the registry) with the attestations on it."""
    try:
        if digest in {registry.tag_digest(name, t) for t in tags}:
            log.info(f"kept {registry.host}/{name}@{digest}: a tag serves it (the rollback could not move it back)")
            return
        gone = journal.delete_with_referrers(registry, name, digest, artifacts)
    except (PublishError, InfraError):  # the registry that failed the publish: the next command's journal
        gone = False
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
