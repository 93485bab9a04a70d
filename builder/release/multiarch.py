"""One multi-arch release from several per-platform accepted reports (docs/image.md "Publishing a multi-arch index").

Each platform's image is built and accepted on its own ("independent builds"). `publish_index` takes their
reports, refuses a set that is not one release (commits or build inputs differ, a lock not made for its member's
platform from those inputs, two reports of one platform, repositories or tags differ), then in publish's order
(builder/release/publish.py): every member manifest by digest, verified; the OCI index of exactly those digests by
digest, read back; with a key each member's three attestations and the index's record, signed and verified; the SHA
tag, then the other tags, onto the index; each member's report names the index; then each cluster-accepted member's
.sqsh under its platform's pointer (builder/release/sqsh_layout.py), following the member's digest. The publish
journal (builder/release/journal.py) holds the intent, those placements included, from the first release write on.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import faults, log
from builder.core import files as fs
from builder.core.constants import TOOL_URI
from builder.core.errors import AttestationError, BadInput, PublishError
from builder.core.imageref import ImageRef, Repository, digest_of
from builder.core.options import Settings
from builder.core.records import PublishReceipt, Report
from builder.engine import client as engine
from builder.engine import local_store
from builder.engine.platforms import Platform, choose
from builder.engine.registry import Registry, verify_tag
from builder.image.identity import build_inputs
from builder.lock.record import Lock
from builder.pins.model import Pins
from builder.release import attest, dsse, journal, promote, publish, referrers, sqsh_layout, sqsh_place, trust, verify
from builder.report import document as report_mod

RECORD_TYPE = f"{TOOL_URI}/multi-arch-index/v1"  # the index's signed record: each member and its gates
RECORD_FILE = "index-record.json"  # beside each member's report.json


@dataclass(frozen=True)
class Member:
    """One platform's accepted report, with the pins and lock `trust.check` re-read for it."""
    path: Path
    report: Report
    pins: Pins
    lock: Lock

    @property
    def platform(self) -> Platform:
        return Platform.parse(self.report.platform).normal()


def load(paths: list[Path]) -> list[Member]:
    """Each report read, ACCEPTED and supported by its own pins and lock (trust.check); the set checked."""
    members = []
    for path in paths:
        report = report_mod.load(path)
        publish.check_accepted(report, str(path))
        checked = trust.check(report, str(path))
        if checked is None:
            raise PublishError(f"{path}: no pins and lock checked against the report; refusing")
        members.append(Member(path, report, *checked))
    check_set(members)
    return members


def check_set(members: list[Member]) -> None:
    """One release or BadInput (exit 2), one line naming the report and what differs: two reports at least,
    one repository and tag list, the same three commits and build inputs apart from the base, each lock made for
    its own base (`# for: base=`) and those commits, and one report per platform."""
    if len(members) < 2:
        raise BadInput("publish: a multi-arch index needs two reports of different platforms at least")
    first = members[0]
    seen: dict[Platform, Path] = {}
    for m in members:
        where = str(m.path)
        if m.platform in seen:
            raise BadInput(f"{where}: platform {m.platform} again (also {seen[m.platform]}); one report per platform")
        seen[m.platform] = m.path
        if Platform.parse(m.pins.base.platform).normal() != m.platform:
            raise BadInput(f"{where}: the report says {m.platform}, its pins base.platform {m.pins.base.platform}")
        if (m.report.repository, m.report.tags) != (first.report.repository, first.report.tags):
            raise BadInput(f"{where}: publishes to {m.report.repository} {m.report.tags}, {first.path} to "
                           f"{first.report.repository} {first.report.tags}; one index has one repository and tags")
        commits, want = _commits(m.pins), _commits(first.pins)
        if commits != want:
            name = next(n for n in want if commits.get(n) != want[n])
            raise BadInput(f"{where}: components.{name}.commit is {commits.get(name)}, {first.path} has {want[name]};"
                           " an index holds one release of the same three commits")
        mine, theirs = _inputs(m.pins), _inputs(first.pins)
        if mine != theirs:
            key = next(k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k))
            raise BadInput(f"{where}: {key} differs from {first.path}; each platform is built from the same "
                           "pins' requirements")
        made = {"base": m.pins.base.digest, **commits}
        wrong = [k for k, v in made.items() if m.lock.built_for.get(k) != v]
        if wrong or not m.lock.inputs_sha256:
            what = f"made for {wrong[0]}={m.lock.built_for.get(wrong[0], 'nothing')}" if wrong else "has no inputs-sha256"
            raise BadInput(f"{m.lock.path}: the lock of {where} {what}, not for its platform {m.platform} "
                           f"(base {m.pins.base.digest}); run `builder lock` on its pins")


def _commits(pins: Pins) -> dict[str, str]:
    return {name: comp.commit for name, comp in pins.components.items()}


def _inputs(pins: Pins) -> dict[str, str]:
    """The build inputs other than the base, flattened to dotted keys (what must agree across platforms)."""
    data = build_inputs(pins)
    flat: dict[str, str] = {}
    for name, comp in data["components"].items():
        for key, value in comp.items():
            flat[f"components.{name}.{key}"] = json.dumps(value, sort_keys=True)
    for key, value in data["build"].items():
        flat[f"build.{key}"] = json.dumps(value, sort_keys=True)
    flat["base.python"] = json.dumps(data["base"]["python"])
    return flat


def member_record(m: Member, digest: str) -> dict[str, Any]:
    """What the index's record says of one member: its digest and platform, the gates its pins required (all
    pass) and every other gate with its status and reason, so a member accepted on fewer gates never reads as
    fully accepted."""
    required = list(m.report.required_gates)
    return {"platform": str(m.platform), "digest": digest, "image_id": m.report.image_id,
            "report": str(m.path.absolute()), "accepted_on": required,
            "not_required": [{"gate": g.name, "status": g.status, "reason": g.reason}
                             for g in m.report.gates if g.name not in required]}


def descriptor(manifest: bytes, media_type: str, platform: Platform, record: dict[str, Any]) -> dict[str, Any]:
    """The index entry of one member manifest: its platform (variant only where it has one) and its gates."""
    plat = {"os": platform.os, "architecture": platform.architecture}
    if platform.variant:
        plat["variant"] = platform.variant
    return {"mediaType": media_type, "digest": digest_of(manifest),
            "size": len(manifest), "platform": plat,
            "annotations": {"dev.rl-image-builder.accepted-on": ",".join(record["accepted_on"]),
                            "dev.rl-image-builder.not-required": ",".join(g["gate"] for g in record["not_required"])}}


def index_body(entries: list[dict[str, Any]]) -> bytes:
    """The OCI image index over exactly these member descriptors, in the reports' order."""
    doc = {"schemaVersion": 2, "mediaType": referrers.OCI_INDEX, "manifests": entries}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def record_statement(repository: str, index_digest: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    return attest.statement(repository, index_digest, RECORD_TYPE, {"members": records})


def publish_index(paths: list[Path], settings: Settings, signing_key: Path | None = None) -> str:
    """Publish the accepted per-platform reports as one OCI index; returns `repository@<index digest>`."""
    members = load(paths)
    first = members[0].report
    repo = publish.repository_of(first, str(members[0].path))
    settings = settings.for_release(repo)
    registry = Registry.from_settings(repo.host, settings)
    registry.ping()
    key = attest.signer(signing_key or settings.signing_key, settings.key_passphrase)
    for m in members:
        publish.check_signed_acceptance(m.report, m.path, key, str(m.path))
    copies = [_prepare_sqsh(m, settings) for m in members]  # each cluster member's .sqsh checked, kept by digest
    try:
        at = _publish(members, copies, settings, registry, key)
    finally:  # a kept file that no pointer names goes (a refused or failed publish)
        for copy in copies:
            if copy is not None:
                copy.discard()
    return at


def _prepare_sqsh(m: Member, settings: Settings) -> sqsh_place.Copy | None:
    """A cluster-accepted member's .sqsh copied and checked beside where it is placed (acceptance.slurm.publish_dir,
    else where its gates read it), before anything is promoted; None for a member the Docker gates accepted."""
    slurm = m.pins.acceptance.slurm
    pinned = slurm.publish_dir if slurm is not None else None
    return sqsh_place.prepare(m.report, str(m.path), settings, Path(pinned) if pinned else None)


def _publish(members: list[Member], copies: list[sqsh_place.Copy | None], settings: Settings, registry: Registry,
             key: dsse.PrivateKey | None) -> str:
    """publish_index's journaled order under the repository lock; the members' .sqsh placed after the receipts."""
    first = members[0].report
    repo = publish.repository_of(first, str(members[0].path))
    name = repo.path
    tags = list(first.tags)
    with promote.repository_lock(first.repository, settings):
        journal.recover(repo, settings, registry, receipts_after_kill)
        accepted = [promote.accepted_ref(m.report, str(m.path)) for m in members]
        staged, client = [], None
        for m, acc in zip(members, accepted):
            if acc is None:  # accepted on a local image: its blobs in the image store, pushed by digest below
                client = client or engine.connect(settings)
                acc = publish.local_ref(client, m.report, None, str(m.path), settings)
            staged.append(acc)
        bodies = [_staged_manifest(registry, ref, settings, acc is None) for ref, acc in zip(staged, accepted)]
        records = [member_record(m, str(ref.digest)) for m, ref in zip(members, staged)]
        index = index_body([descriptor(body, media, m.platform, rec)
                            for (body, media), m, rec in zip(bodies, members, records)])
        digest = digest_of(index)
        plan = journal.Journal(repository=repo, report=str(members[0].path.absolute()), digest=digest,
                               media_type=referrers.OCI_INDEX, existed=registry.tag_digest(name, digest) is not None,
                               tags=[journal.TagMove(tag=t, old=registry.tag_digest(name, t), new=digest)
                                     for t in tags],
                               members_sqsh=[journal.MemberSqsh(report=str(m.path.absolute()), digest=str(ref.digest),
                                                                platform=m.report.platform,
                                                                move=c.journal() if c is not None else None)
                                             for m, ref, c in zip(members, staged, copies)])
        journal.write(plan, settings)
        moved = False
        try:
            with log.step(f"release {len(members)} platform manifests and the index -> {first.repository}"):
                for m, ref, acc in zip(members, staged, accepted):
                    if acc is None:  # its stored blobs to staging by digest first, journaled
                        publish.push_local(ref, plan, settings)
                    promote.release_manifest(str(ref), m.report.image_id, repo, settings)
                    verify_tag(registry, name, str(ref.digest), str(ref.digest), m.report.image_id, m.report.platform)
                registry.put_manifest(name, digest, index, referrers.OCI_INDEX)
                if registry.manifest_by_digest(name, digest) != index:
                    raise PublishError(f"{first.repository}@{digest}: the registry serves another index body")
            plan.phase = "attest"
            journal.write(plan, settings)
            receipts = [_attest_member(m, str(ref.digest), tags, registry, key, plan, settings)
                        for m, ref in zip(members, staged)]
            if key is not None:
                _attest_index(registry, name, first.repository, digest, len(index), records, key, plan, settings)
            at = f"{first.repository}@{digest}"
            for m in members:  # what a killed run's receipts are written from (receipts_after_kill)
                fs.write_atomic(m.path.parent / RECORD_FILE, json.dumps(
                    {"index": at, "tags": tags, "members": records}, indent=1) + "\n")
            plan.phase = "tags"
            journal.write(plan, settings)
            moved = True
            with log.step(f"tag {first.repository}: {', '.join(tags)} -> index {digest[:19]}"):
                promote.move_tags(registry, repo, index, referrers.OCI_INDEX, tags)  # each read back
        except BaseException:
            if not plan.existed:
                publish.withdraw(registry, name, digest, plan.artifacts, tags)
            journal.remove(first.repository, settings)
            raise
        finally:
            if not moved:
                journal.cancel_uploads(registry, plan)
        plan.phase = "receipt"
        journal.write(plan, settings)
        faults.point("publish index: receipt")
        for m, receipt in zip(members, receipts):
            publish.record_receipt(m.report, receipt.model_copy(update={"index": at}), m.path)
        _place_sqsh(members, copies, receipts, key, settings)
        journal.remove(first.repository, settings)  # the receipts and every member's .sqsh are done
    for rec in records:
        cut = ", ".join(f"{g['gate']} {g['status']}" for g in rec["not_required"])
        log.info(f"  {rec['platform']:<16} {rec['digest'][:19]} accepted on {', '.join(rec['accepted_on'])}"
                 + (f"; not required: {cut}" if cut else ""))
    log.info(f"published index {at} ({len(members)} platforms); tags {', '.join(tags)}")
    return at


def _place_sqsh(members: list[Member], copies: list[sqsh_place.Copy | None], receipts: list[PublishReceipt],
                key: dsse.PrivateKey | None, settings: Settings) -> None:
    """Each member's pointer under the SHA tag, named by its platform, flipped onto its kept .sqsh in one rename
    (following the member's digest), recorded in its report and, with a key, its placement signed; a member with
    no .sqsh here removes a pointer of its platform that follows another digest."""
    faults.point("publish index: sqsh")
    for m, copy, receipt in zip(members, copies, receipts):
        if copy is None:
            sqsh_layout.follow(settings, m.report.repository, m.report.tags[0], m.report.platform, receipt.digest)
            continue
        sqsh_place.place(copy, report_mod.load(m.path), m.path, receipt)
        if key is not None:
            attest.sign_placement(report_mod.load(m.path), key, m.path.parent)


def receipts_after_kill(report_path: Path, digest: str, tags: list[str], settings: Settings) -> None:
    """The receipts a killed index publish did not write (journal recovery; the journal names the first
    member's report): from the index record beside it, each member's, read back from the registry."""
    try:
        record = json.loads((report_path.parent / RECORD_FILE).read_text())
    except (OSError, ValueError):
        record = {}
    if not str(record.get("index", "")).endswith(f"@{digest}"):  # a one-platform publish's journal
        publish.receipt_after_kill(report_path, digest, tags, settings)
        return
    for rec in record["members"]:
        path = Path(rec["report"])
        rep = report_mod.load(path)
        if rep.publish is not None and rep.publish.index == record["index"]:
            continue
        repo = publish.repository_of(rep, str(path))
        facts = verify_tag(Registry.from_settings(repo.host, settings), repo.path, rec["digest"], rec["digest"],
                           rep.image_id, rep.platform)
        publish.record_receipt(rep, PublishReceipt(
            repository=repo, tags=tags, digest=rec["digest"], config_digest=facts["config_digest"],
            verified=True, platform=facts["platform"], pushed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            index=record["index"]), path)


def _staged_manifest(registry: Registry, ref: ImageRef, settings: Settings, local: bool) -> tuple[bytes, str]:
    """The member's manifest bytes and media type: a staged one's from the registry (hash-checked by the registry
    client), a local one's from the image store (pushed once the journal holds the intent)."""
    if local:
        body = local_store.stored_manifest(settings, str(ref.digest))
        return body, str(json.loads(body).get("mediaType") or referrers.OCI_MANIFEST)
    body = registry.manifest_by_digest(Repository.of(ref).path, str(ref.digest))
    return body, str(json.loads(body).get("mediaType") or referrers.OCI_MANIFEST)


def _attest_member(m: Member, digest: str, tags: list[str], registry: Registry, key: dsse.PrivateKey | None,
                   plan: journal.Journal, settings: Settings) -> PublishReceipt:
    """The member's own three attestations (publish.attest_published) and its receipt (tags: the index's)."""
    with log.step(f"attest {m.report.repository}@{digest[:19]} ({m.platform})"):
        found = publish.attest_published(m.report, m.pins, m.lock, registry, digest, key, False, plan, settings)
    repo = publish.repository_of(m.report, str(m.path))
    facts = verify_tag(registry, repo.path, digest, digest, m.report.image_id, m.report.platform)
    return PublishReceipt(repository=repo, tags=tags, digest=digest,
                          config_digest=facts["config_digest"], verified=True, platform=facts["platform"],
                          pushed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), attestations=found)


def _attest_index(registry: Registry, name: str, repository: str, digest: str, size: int,
                  records: list[dict[str, Any]], key: dsse.PrivateKey, plan: journal.Journal,
                  settings: Settings) -> None:
    """The index's record, signed and attached to the index, then read back and verified with the key."""
    def note(kind: str, value: str) -> None:
        (plan.uploads if kind == "upload" else plan.artifacts).append(value)
        journal.write(plan, settings)

    envelope = json.dumps(dsse.sign(record_statement(repository, digest, records), key), sort_keys=True).encode()
    subject = {"mediaType": referrers.OCI_INDEX, "digest": digest, "size": size}
    with log.step(f"attest index {repository}@{digest[:19]}"):
        referrers.attach(registry, name, subject, envelope, RECORD_TYPE, note)
        if read_record(registry, name, digest, key.public_key()) is None:
            raise PublishError(f"{repository}@{digest}: read back, no index record verified by the key; no tag moved")


def read_record(registry: Registry, name: str, digest: str, public_key: dsse.PublicKey) -> dict[str, Any] | None:
    """The index record a trusted key signed for this index digest, or None."""
    for desc in referrers.discover(registry, name, digest):
        if (desc.get("annotations") or {}).get(referrers.PREDICATE_ANNOTATION) != RECORD_TYPE:
            continue
        _, envelope = referrers.fetch_envelope(registry, name, desc)
        try:
            stmt = attest.open_statement(envelope, public_key, digest)
        except AttestationError:  # another key's envelope, or one for another subject: not this record
            continue
        if stmt.get("predicateType") == RECORD_TYPE:
            return dict(stmt.get("predicate") or {})
    return None


def verify_platform(ref: str, platform: str, keys: list[dsse.PublicKey], settings: Settings,
                    require_all_keys: bool = False) -> verify.Outcome:
    """`builder verify INDEX --platform P`: the index's entry for P (matched as the engine does), the index's
    record signed by a trusted key, then the member verified as one image (builder/release/verify.py) against
    its own acceptance: its signed test result must pass every gate the record says it was accepted on, and
    list the others as the record does. The outcome names the member's gates."""
    host, name, digest = verify.parse_reference(ref)
    reg = Registry.from_settings(host, settings)
    reg.ping()
    digest = digest or verify.resolve(reg, ref)
    got = reg.manifest(name, digest)
    if got["computed"] != digest:
        raise AttestationError("index", f"registry serves {got['computed']} for {digest}")
    doc = json.loads(got["content"])
    if not isinstance(doc.get("manifests"), list):
        raise BadInput(f"--platform: {ref} is one image ({doc.get('mediaType')}), not an index; verify it "
                       "without --platform")
    try:
        member = choose(doc, platform, f"{host}/{name}@{digest}")
    except BadInput as exc:
        raise BadInput("--platform: " + str(exc).split(": ", 1)[1].split(";")[0]) from None
    record = next((r for k in keys if (r := read_record(reg, name, digest, k)) is not None), None)
    if record is None:
        raise AttestationError("index record", f"no record of {digest} signed by a trusted key")
    rec = next((r for r in record.get("members") or [] if r.get("digest") == member), None)
    if rec is None:
        raise AttestationError("index record", f"{member} ({platform}) is in the index but not in its signed record")
    out = verify.verify(f"{host}/{name}@{member}", keys, settings, require_all_keys)
    _check_member_gates(reg, name, member, keys, rec)
    cut = "; ".join(f"{g['gate']} {g['status']} ({g['reason']})" for g in rec["not_required"])
    out.passed[:0] = [f"index: {ref} is {digest}; its {platform} member is {member}",
                      "index record: signed by a trusted key, lists the member"]
    out.passed.append(f"member gates: accepted on {', '.join(rec['accepted_on'])} (its own signed test result)"
                      + (f"; not required: {cut}" if cut else "; every gate"))
    return out


def _check_member_gates(reg: Registry, name: str, digest: str, keys: list[dsse.PublicKey],
                        rec: dict[str, Any]) -> None:
    """The record's gates for a member against the member's own signed test result."""
    for key in keys:
        for desc in referrers.discover(reg, name, digest):
            try:
                stmt = attest.open_statement(referrers.fetch_envelope(reg, name, desc)[1], key, digest)
            except (AttestationError, PublishError, ValueError):
                continue
            if stmt.get("predicateType") != attest.TEST_RESULT_TYPE:
                continue
            pred = stmt.get("predicate") or {}
            passed = set(pred.get("passedTests") or [])
            missing = [g for g in rec["accepted_on"] if g not in passed]
            claimed = [g["gate"] for g in rec["not_required"] if g["status"] == "pass" and g["gate"] not in passed]
            if missing or claimed:
                raise AttestationError("member gates", f"the record says {', '.join(missing or claimed)} passed; "
                                       f"{digest}'s signed test result passed {', '.join(sorted(passed)) or 'none'}")
            return
    raise AttestationError("member gates", f"no signed test result for {digest}")
