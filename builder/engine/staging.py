"""Staging -> accept -> promote of one digest, through the registry HTTP API (builder/engine/registry.py).

- `push`: the normalised image (builder/engine/normalize.py) goes to the staging repository by digest; base
  layers are never uploaded (HEAD, else a cross-repository mount from the base repository).
- `pull`: acceptance pulls `<staging>@<digest>` into an engine and checks the pulled image ID.
- `promote`: the accepted digest goes into the release repository by digest (every blob mounted from staging),
  then release tags are PUT with those very manifest bytes, the SHA tag first; nothing else can receive a release
  tag. builder/release/publish.py attests between the two steps.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from builder.core import faults, log
from builder.core import files as fs
from builder.core.errors import BadInput, BuildFailed, InfraError, PublishError
from builder.core.imageref import ImageRef, Repository, digest_of
from builder.core.options import Settings
from builder.core.records import Pulled, Report
from builder.core.safetext import show
from builder.engine import platforms
from builder.engine.normalize import MANIFEST_TYPE, blob_path
from builder.engine.registry import Registry, copy_blobs, parse_repository
from builder.engine.registry import auth_config as registry_auth_config

ROLLBACK_RETRY_S = 15.0
BASE_NAME = "org.opencontainers.image.base.name"
BASE_DIGEST = "org.opencontainers.image.base.digest"


def staging_repository(repository: Repository | str, staging: Repository | None = None) -> Repository:
    """The pins' image.staging, or `<repository>-staging` (text: a caller's own, parsed here)."""
    return staging or parse_repository(f"{repository}-staging")


def base_of(labels: dict[str, str], settings: Settings,
            platform: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The base image's config and its manifest's layer descriptors, from its registry by digest. The label names
    the platform manifest (render resolves an index: engine/platforms.py); an index there is taken to `platform`'s
    entry, or refused in one line without one."""
    base = parse_repository(labels[BASE_NAME])  # a label the build wrote
    host, name = base.host, base.path
    reg = Registry.from_settings(host, settings)
    where = f"{labels[BASE_NAME]}@{labels[BASE_DIGEST]}"
    try:
        manifest = json.loads(reg.manifest_by_digest(name, labels[BASE_DIGEST]))
        if "manifests" in manifest:
            if platform is None:
                raise BuildFailed(f"base image {where}: an index; expected the platform manifest's digest in "
                                  f"{BASE_DIGEST} (builder render resolves the index to base.platform's entry)")
            manifest = json.loads(reg.manifest_by_digest(name, platforms.choose(manifest, platform, where)))
        config = json.loads(reg.blob(name, manifest["config"]["digest"]))
    except PublishError as err:
        raise BuildFailed(f"base image {labels[BASE_NAME]}@{labels[BASE_DIGEST]}: {err}") from None
    layers = [{"mediaType": d["mediaType"], "size": d["size"], "digest": d["digest"]} for d in manifest["layers"]]
    return config, layers


def push(manifest_digest: str, repository: Repository | str, base_name: str | None, settings: Settings,
         tag: str | None = None, on_session: Callable[[str], None] | None = None) -> ImageRef:
    """Push an image whose blobs are in the local store (normalised, or builder/engine/local_store.py) by digest,
    and `tag` if given; return `<repository>@<digest>`. Blobs the registry has are skipped (HEAD); blobs not in the
    store are base layers: mounted from the base repository (`base_name`, else the config's base label), never
    re-uploaded. `on_session`: told each upload session's path before its PUT (the publish journal)."""
    repository = parse_repository(repository)  # a Repository passes as it is; text (a tool's, a test's) is parsed
    host, name = repository.host, repository.path
    try:
        manifest = blob_path(settings, manifest_digest).read_bytes()
    except OSError:
        raise PublishError(f"{manifest_digest}: not in the image store {blob_path(settings, manifest_digest)}; "
                           "expected the local image's blobs there") from None
    doc = json.loads(manifest)
    base_name = base_name or _base_label(settings, doc["config"]["digest"]) or repository
    base = parse_repository(base_name)  # the pins' base, as a label or the pins name it
    base_host, base_repo = base.host, base.path
    reg = Registry.from_settings(host, settings)
    reg.ping()
    counts = {"uploaded": 0, "mounted": 0, "present": 0, "copied": 0}
    with log.step(f"push {repository}@{manifest_digest[:19]}"):
        base_blobs = []
        for blob in [*doc["layers"], doc["config"]]:
            digest = blob["digest"]
            path = blob_path(settings, digest)
            if reg.has_blob(name, digest):
                counts["present"] += 1
            elif path.exists():
                reg.upload_blob(name, digest, str(path), on_session)
                counts["uploaded"] += 1
            elif base_host == host and reg.mount_blob(name, digest, base_repo):
                counts["mounted"] += 1
            elif base_host == host:
                raise PublishError(f"{repository}: base layer {digest} is not in the registry and cannot be "
                                   f"mounted from {base_name}")
            else:
                base_blobs.append(blob)
        if base_blobs:  # a base on another registry: its layers copied from there, never rebuilt here
            moved = copy_blobs(Registry.from_settings(base_host, settings), base_repo, reg, name, base_blobs,
                               progress=log.info)
            counts["copied"] += moved["copied"] + moved["mounted"]
        reg.put_manifest(name, manifest_digest, manifest, MANIFEST_TYPE)
        if tag:
            reg.put_manifest(name, tag, manifest, MANIFEST_TYPE)
    log.info(f"staged {repository}@{manifest_digest} ({', '.join(f'{v} {k}' for k, v in counts.items())})")
    return ImageRef(f"{repository}@{manifest_digest}")


def _base_label(settings: Settings, config_digest: str) -> str | None:
    """The base repository a stored config names in its labels (render writes it), or None."""
    try:
        config = json.loads(blob_path(settings, config_digest).read_bytes())
        return str((config.get("config") or {}).get("Labels", {})[BASE_NAME])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def pull(client: Any, ref: str, expected_id: str | None, settings: Settings) -> Pulled:
    """Pull `repo@sha256:...` into the engine. The manifest served at that digest (hash-checked) names the
    config; it must be `expected_id` (when given) and the pulled image ID must equal it.
    A digest the registry does not serve is PublishError (exit 1) with one clear line."""
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        image = ImageRef(ref, need_domain=True, need_digest=True)
    except ValueError as exc:
        raise BadInput(f"--image {show(ref, 120)}: expected REPOSITORY@sha256:<64 hex> ({exc})") from None
    host, name, digest, repository = image.registry, image.repository, str(image.digest), image.name
    reg = Registry.from_settings(host, settings)
    auth_config = registry_auth_config(host, settings)  # that host's own credentials only
    with log.step(f"pull {ref}"):  # the registry's answers first; an engine that has the digest needs no transfer
        reg.ping()
        if reg.tag_digest(name, digest) is None:
            raise PublishError(f"{ref}: not in the registry ({host} does not serve {name}@{digest})")
        config_digest = json.loads(reg.manifest_by_digest(name, digest))["config"]["digest"]
        if expected_id and config_digest != expected_id:
            raise PublishError(f"{ref}: its config is {config_digest}, the build made {expected_id}; refusing")
        try:
            # the engine reports a failed pull inside the stream (HTTP 200)
            for item in client.api.pull(repository, tag=digest, auth_config=auth_config, stream=True, decode=True):
                if "error" in item or "errorDetail" in item:
                    message = item.get("error") or (item.get("errorDetail") or {}).get("message", "error")
                    raise InfraError(f"docker engine: pull {ref}: {' '.join(str(message).split())[:200]}")
            image_id = client.api.inspect_image(ref)["Id"]
        except docker.errors.APIError as err:
            raise InfraError(f"docker engine: pull {ref}: {str(err)[:300]}") from None
    if image_id != config_digest:
        raise PublishError(f"{ref}: the engine made image {image_id} of it, the manifest names {config_digest}")
    return Pulled(ref=image, digest=digest, image_id=image_id)


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
