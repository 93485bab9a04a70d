"""Staging -> accept -> promote of one digest, through the registry HTTP API (builder/engine/registry.py).

- `push`: the normalised image (builder/engine/normalize.py) goes to the staging repository by digest; base
  layers are never uploaded (HEAD, else a cross-repository mount from the base repository).
- `pull`: acceptance pulls `<staging>@<digest>` into an engine and checks the pulled image ID.
- the staged digest's release (its manifest into the release repository, the tags in order, their rollback) is
  builder/release/promote.py's.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from builder.core import log
from builder.core.errors import BadInput, BuildFailed, InfraError, PublishError
from builder.core.imageref import ImageRef, Repository
from builder.core.options import Settings
from builder.core.records import Pulled
from builder.core.safetext import show
from builder.engine import platforms
from builder.engine.normalize import MANIFEST_TYPE, blob_path
from builder.engine.registry import Registry, copy_blobs, parse_repository
from builder.engine.registry import auth_config as registry_auth_config

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
