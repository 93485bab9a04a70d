"""Promote one accepted staged digest, through the registry HTTP API (builder/engine/registry): the digest goes into
the release repository by digest (every blob mounted from staging), then release tags are PUT with those very
manifest bytes, the SHA tag first, each read back; nothing else can receive a release tag, and a failure puts every
moved tag back. builder/release/publish.py attests between the two steps and journals them. Which staged digest
may be promoted (`accepted_ref`) is read from the report here too: the release side holds the whole decision, and
the engine side (builder/engine/staging.py) only pushes to staging and pulls from it."""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from builder.core import faults, log
from builder.core import files as fs
from builder.core.errors import InfraError, PublishError
from builder.core.imageref import ImageRef, Repository, digest_of
from builder.core.options import Settings
from builder.core.records import Report
from builder.engine.normalize import MANIFEST_TYPE
from builder.engine.registry import Registry

ROLLBACK_RETRY_S = 15.0


def release_manifest(staged_ref: str, image_id: str, repository: Repository, settings: Settings) -> tuple[bytes, str]:
    """Step 1 of a release: mount every blob of the accepted staged digest from staging and PUT its very manifest
    bytes into the release repository by digest (no tag); returns (bytes, media type). The caller reads it back
    (publish: registry.verify_tag by digest; promote: each tag after its PUT)."""
    staged = ImageRef(staged_ref, need_domain=True, need_digest=True)
    s_host, s_name, digest = staged.registry, staged.repository, str(staged.digest)
    host, name = repository.host, repository.path
    if s_host != host:
        raise PublishError(f"{staged_ref}: staging and release repositories must share a registry ({s_host} != {host})")
    reg = Registry.from_settings(host, settings)
    reg.ping()
    manifest = reg.manifest_by_digest(s_name, digest)  # hash-checked: exactly the accepted bytes
    doc = json.loads(manifest)
    if doc.get("config", {}).get("digest") != image_id:
        raise PublishError(f"{staged_ref}: its config is {doc.get('config', {}).get('digest')}, "
                           f"acceptance ran on {image_id}; refusing")
    for desc in [*doc["layers"], doc["config"]]:
        if not reg.has_blob(name, desc["digest"]) and not reg.mount_blob(name, desc["digest"], s_name):
            raise PublishError(f"{repository}: could not mount blob {desc['digest']} from {staged.name}")
    media_type = doc.get("mediaType") or MANIFEST_TYPE
    reg.put_manifest(name, digest, manifest, media_type)  # the registry's digest of the bytes is checked here
    faults.point("publish: manifest")
    return manifest, media_type


def move_tags(reg: Registry, repository: Repository, manifest: bytes, media_type: str, tags: list[str],
              pushed: dict[str, str] | None = None, check: Callable[[str], object] | None = None) -> dict[str, str]:
    """Step 3 and 4 of a release: PUT the manifest (already in the repository by digest) under each tag in the
    order given: the SHA tag first, a moving tag only once the tags before it serve the digest (read back, and
    `check`ed: the caller's read-back of a tag, raising). All or nothing against errors Python sees, the read-backs
    included: every tag whose PUT was sent goes back where it was, last first (a PUT whose answer was lost may
    have landed; `rollback`). A SIGKILL leaves the publish journal (builder/release/journal.py)."""
    name = repository.path
    digest = digest_of(manifest)
    before = snapshot(reg, name, tags)
    pushed = {} if pushed is None else pushed  # filled as tags land
    sent: list[str] = []  # every tag a PUT was sent for, in order, landed or not
    existed = True  # the digest is in the repository by now; a rollback never deletes it
    try:
        for i, tag in enumerate(tags):
            faults.point(f"promote tag {i}")
            sent.append(tag)
            pushed[tag] = reg.put_manifest(name, tag, manifest, media_type)
            if reg.tag_digest(name, tag) != digest:
                raise PublishError(f"{repository}:{tag}: does not serve {digest} after the push")
            if check is not None:
                check(tag)
    except BaseException:
        rollback(reg, repository, {t: before[t] for t in sent}, digest, existed)
        pushed.clear()
        raise
    return pushed


def promote(staged_ref: str, image_id: str, repository: Repository, tags: list[str], settings: Settings,
            pushed: dict[str, str] | None = None) -> dict[str, Any]:
    """Give the accepted staged digest its release tags: the manifest by digest first (`release_manifest`),
    then the tags in order, the first tag (the SHA tag) first (`move_tags`). Returns {digest, pushed}."""
    manifest, media_type = release_manifest(staged_ref, image_id, repository, settings)
    reg = Registry.from_settings(repository.host, settings)
    moved = move_tags(reg, repository, manifest, media_type, tags, pushed)
    return {"digest": digest_of(manifest), "pushed": moved}


@contextmanager
def repository_lock(repository: str, settings: Settings) -> Iterator[None]:
    """One tag-moving run per release repository at a time among the runs sharing this cache (a nightly fleet):
    two runs promoting one digest would otherwise read, write and roll back the same tags at once."""
    name = hashlib.sha256(repository.encode()).hexdigest()[:24]
    with fs.locked(settings.cache("locks") / f"promote-{name}.lock"):
        yield


def snapshot(reg: Registry, name: str, tags: list[str]) -> dict[str, tuple[bytes, str] | None]:
    """The manifest bytes and media type each tag serves now; None for a tag that does not exist."""
    out: dict[str, tuple[bytes, str] | None] = {}
    for tag in tags:
        got = reg.manifest(name, tag) if reg.tag_digest(name, tag) is not None else None
        out[tag] = (bytes(got["content"]), str(got["media_type"])) if got else None
    return out


def rollback(reg: Registry, repository: Repository, moved: dict[str, tuple[bytes, str] | None], digest: str,
             existed: bool) -> None:
    """Put each moved tag back on the manifest it served before, in the reverse of the order they moved (the
    moving tags before the SHA tag: a moving tag never serves the new digest while the SHA tag does not). A tag
    that did not exist goes with the new manifest, deleted by digest, unless the repository held that digest
    before (`existed`). A registry that does not answer is tried again for ROLLBACK_RETRY_S (a restart); a PUT
    whose answer was lost counts when the tag is read back on its old digest. Once a tag cannot be put back, the
    tags moved before it stay (each then serves its old digest or the new, whole one, a moving tag the new one
    only with the SHA tag); what could not be undone is logged instead of raising over the error that led here."""
    name = repository.path
    deadline = time.monotonic() + ROLLBACK_RETRY_S
    stuck: str | None = None
    for tag, prev in reversed(list(moved.items())):
        if stuck is not None:
            log.info(f"left {repository}:{tag} on {digest}: {stuck} could not be moved back after it")
            continue
        while True:
            try:
                if prev is not None:
                    reg.put_manifest(name, tag, prev[0], prev[1])
                    log.info(f"rolled back {repository}:{tag} to {_digest(prev[0])}")
                elif not existed and reg.delete_manifest(name, digest):
                    log.info(f"rolled back {repository}:{tag} (it was new; {digest} removed)")
                elif _serves(reg, name, tag, digest):  # new, and the digest stays: the tag stays on it
                    log.info(f"could not roll back {repository}:{tag}; it serves {digest}")
                    stuck = tag
                break
            except InfraError as err:
                if prev is not None and _serves(reg, name, tag, _digest(prev[0])):
                    log.info(f"rolled back {repository}:{tag} to {_digest(prev[0])} (read back; the answer was lost)")
                    break
                if time.monotonic() < deadline:
                    time.sleep(1.0)
                    continue
                log.info(f"could not roll back {repository}:{tag}: {err}")
                stuck = tag
                break
            except PublishError as err:
                log.info(f"could not roll back {repository}:{tag}: {err}")
                stuck = tag
                break


def _serves(reg: Registry, name: str, tag: str, digest: str) -> bool:
    """Whether the tag serves the digest now, read back by HEAD; False when the registry does not say."""
    try:
        return reg.tag_digest(name, tag) == digest
    except (InfraError, PublishError):
        return False


def _digest(data: bytes) -> str:
    return digest_of(data)


def accepted_ref(report: Report, where: str) -> ImageRef | None:
    """The staged `repo@digest` acceptance pulled and ran on, cross-checked across the report; None for
    a report accepted on a local image ID (no staging). Any disagreement is PublishError."""
    acc = report.acceptance
    pulled = acc.pulled if acc else None
    if pulled is None:
        return None
    ref, digest = pulled.ref, pulled.ref.digest
    checks = [(digest == pulled.digest, f"acceptance pulled {pulled.digest}, its ref names {ref}"),
              (pulled.image_id == report.image_id == (acc.image_id if acc else None),
               f"acceptance ran on {pulled.image_id}, the report is for {report.image_id}")]
    if report.build is not None:
        checks += [(report.build.staged == ref, f"the build staged {report.build.staged}, acceptance pulled {ref}"),
                   (report.build.manifest_digest == digest,
                    f"the build made manifest {report.build.manifest_digest}, acceptance pulled {digest}")]
    for ok, why in checks:
        if not ok:
            raise PublishError(f"{where}: {why}; only the digest that passed acceptance gets release tags")
    return ref
