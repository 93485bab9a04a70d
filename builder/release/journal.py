"""The publish journal: what a publish intends, in the cache, keyed by repository like the promote lock.

Written before the first registry write and removed once the receipt, the .sqsh and the nightly tags are done.
The next publish, run or nightly on the repository reads it first (under the lock) and says in one line what it
did: from the `tags` phase on the image is whole and attested, so the tags are finished (no key needed); before
it, the publish is finished when the caller can (`resume`: the key that signed it, the report, and its pins and
lock still matching their recorded sha256) and abandoned otherwise (upload sessions cancelled, a digest that no
tag serves deleted with its attestations, a kept .sqsh that no pointer names removed). Nothing a tag serves is
ever deleted.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from builder.core import files as fs
from builder.core import log
from builder.core.errors import BadInput, PublishError
from builder.core.imageref import Repository
from builder.core.options import Settings
from builder.engine.registry import Registry, parse_repository
from builder.release import referrers, sqsh_layout
from builder.release.sqsh_layout import SqshMove

PHASES = ("manifest", "attest", "tags", "receipt")  # from "tags" on: finish, never abandon


class TagMove(BaseModel):
    tag: str
    old: str | None = None
    new: str


class MemberSqsh(BaseModel):
    """A multi-arch member's .sqsh: its pointer (named by its platform) flips once the tags serve the index; without
    one (`move` None) a pointer of its platform that follows another digest goes."""
    report: str
    digest: str  # the member's manifest digest, which the pointer follows
    platform: str
    move: SqshMove | None = None


class Journal(BaseModel):
    repository: str
    report: str
    digest: str
    media_type: str
    phase: str = "manifest"
    existed: bool = False  # the repository held the digest before: never delete it
    tags: list[TagMove] = Field(default_factory=list)  # in the order they move: the SHA tag first
    uploads: list[str] = Field(default_factory=list)  # upload session locations opened
    artifacts: list[str] = Field(default_factory=list)  # attestation manifests pushed
    sqsh: SqshMove | None = None
    nightly: list[str] = Field(default_factory=list)
    platform: str = ""  # the image's (a .sqsh pointer follows it); "" for an index
    signer: str = ""  # the key ID that attests it ("" without a key): only that key finishes it before its tags
    members_sqsh: list[MemberSqsh] = Field(default_factory=list)  # an index publish's .sqsh per member


def path_of(repository: str, settings: Settings) -> Path:
    name = hashlib.sha256(repository.encode()).hexdigest()[:24]
    return settings.cache("locks") / f"publish-{name}.json"


def write(journal: Journal, settings: Settings) -> None:
    fs.write_atomic(path_of(journal.repository, settings), journal.model_dump_json(indent=1) + "\n")


def read(repository: str, settings: Settings) -> Journal | None:
    path = path_of(repository, settings)
    try:
        return Journal.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.info(f"publish journal {path} unreadable; removed")
        path.unlink(missing_ok=True)
        return None


def remove(repository: str, settings: Settings) -> None:
    path_of(repository, settings).unlink(missing_ok=True)


Receipt = Callable[[Path, str, list[str], Settings], None]  # (report.json, digest, tags, settings)
Resume = Callable[["Journal"], None]  # publishes the journal's report again; PublishError/BadInput: cannot


def recover(repository: Repository | str, settings: Settings, reg: Registry, receipt: Receipt,
            resume: Resume | None = None) -> str:
    """Finish or undo what a killed publish on `repository` began (call under the repository lock); return the
    one line printed, or "" when there was nothing. `receipt` writes a missing receipt (publish's); `resume`
    finishes a publish killed before its tags (publish's: key, report, pins and lock at hand and matching), else
    it is abandoned."""
    journal = read(repository, settings)
    if journal is None:
        return ""
    name = parse_repository(repository).path  # a Repository passes as it is; a caller's text is parsed
    cancel_uploads(reg, journal)
    if PHASES.index(journal.phase) >= PHASES.index("tags"):
        line = finish(reg, name, journal, settings, receipt)
    else:
        dropped = drop_unindexed(reg, name, journal)
        why = "no way to finish an index publish here" if resume is None else ""
        if resume is not None:
            try:
                resume(journal)
            except (PublishError, BadInput) as err:
                why = str(err)
        cut = f"; deleted {dropped} attestation(s) no index listed" if dropped else ""
        line = (abandon(reg, name, journal, why + cut) if why else
                f"finished the publish of {repository}@{journal.digest} that a killed run began before its tags "
                f"({'the key at hand, ' if journal.signer else ''}the report's pins and lock still match{cut})")
    remove(repository, settings)
    log.info(line)
    return line


def cancel_uploads(reg: Registry, journal: Journal) -> None:
    for location in journal.uploads:
        try:
            reg._request("DELETE", location)
        except Exception:  # a session the registry already closed or purged
            pass


def finish(reg: Registry, name: str, journal: Journal, settings: Settings, receipt: Receipt) -> str:
    """Every tag (SHA tag first, then the others, then the nightly tags) onto the digest; the receipt; the .sqsh."""
    manifest = reg.manifest_by_digest(name, journal.digest)
    moved = [m.tag for m in journal.tags] + journal.nightly
    for tag in moved:
        if reg.tag_digest(name, tag) != journal.digest:
            reg.put_manifest(name, tag, manifest, journal.media_type)
    done = [f"tags {', '.join(moved)}"]
    if _receipt(journal, settings, receipt):
        done.append("receipt")
    if journal.sqsh is not None and _place_sqsh(journal.sqsh, journal.report, journal.repository, journal.digest,
                                                journal.platform, settings):
        done.append(".sqsh")
    elif journal.sqsh is None and journal.platform and journal.tags:  # a pointer of another image's .sqsh goes
        sqsh_layout.follow(settings, journal.repository, journal.tags[0].tag, journal.platform, journal.digest)
    placed = []
    for m in journal.members_sqsh:  # an index's members: each platform's pointer
        if m.move is None and journal.tags:
            sqsh_layout.follow(settings, journal.repository, journal.tags[0].tag, m.platform, m.digest)
        elif m.move is not None and _place_sqsh(m.move, m.report, journal.repository, m.digest, m.platform, settings):
            placed.append(m.platform)
    if placed:
        done.append(f".sqsh of {', '.join(placed)}")
    return (f"finished the publish of {journal.repository}@{journal.digest} that a killed run began: "
            + ", ".join(done))


def abandon(reg: Registry, name: str, journal: Journal, why: str) -> str:
    """No tag had moved and it cannot be finished (`why`): delete what that publish added and no tag serves (where
    the registry allows), and its kept .sqsh that no pointer names."""
    head = f"abandoned the publish of {journal.repository}@{journal.digest} that a killed run began ({why}; no tag had moved"
    for move in [journal.sqsh, *(m.move for m in journal.members_sqsh)]:
        if move is not None:
            sqsh_layout.drop_unnamed(Path(move.blob))
    served = {reg.tag_digest(name, m.tag) for m in journal.tags} | {reg.tag_digest(name, t) for t in journal.nightly}
    if journal.existed or journal.digest in served:
        return f"{head}; the digest was there before, kept)"
    gone = delete_with_referrers(reg, name, journal.digest, journal.artifacts)
    what = "deleted it and its attestations" if gone else "this registry refuses DELETE: left unreferenced by tags"
    return f"{head}; {what})"


def drop_unindexed(reg: Registry, name: str, journal: Journal) -> int:
    """Delete the artifacts the killed publish pushed that no referrers index lists (killed before the index PUT)."""
    listed = {d["digest"] for d in referrers.discover(reg, name, journal.digest)}
    return sum(reg.delete_manifest(name, a) for a in journal.artifacts if a not in listed)


def delete_with_referrers(reg: Registry, name: str, digest: str, artifacts: list[str] | None = None) -> bool:
    """Delete a manifest no tag serves with every attestation on it and its referrers-tag index."""
    found = {d["digest"] for d in referrers.discover(reg, name, digest)} | set(artifacts or [])
    for artifact in sorted(found):
        reg.delete_manifest(name, artifact)
    index = reg.tag_digest(name, referrers.fallback_tag(digest))
    if index:
        reg.delete_manifest(name, index)
    return reg.delete_manifest(name, digest) or reg.tag_digest(name, digest) is None


def _receipt(journal: Journal, settings: Settings, receipt: Receipt) -> bool:
    """Write the receipt into the report when it lacks this digest's (the report file may be gone)."""
    path = Path(journal.report)
    if not path.is_file():
        return False
    try:
        receipt(path, journal.digest, [m.tag for m in journal.tags], settings)
    except PublishError as err:
        log.info(f"{path}: no receipt written: {err}")
        return False
    return True


def _place_sqsh(move: SqshMove, report: str, repository: str, digest: str, platform: str,
                settings: Settings) -> bool:
    """The pointer onto the .sqsh the killed publish kept by digest (hashed again first), and the report's record."""
    if not sqsh_layout.flip(move, repository, digest, platform, settings, check=True):
        return False
    if Path(report).is_file():
        sqsh_layout.record_in_report(move, Path(report))
    return True
