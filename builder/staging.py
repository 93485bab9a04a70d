"""Staging -> accept -> promote of one digest, through the registry HTTP API (builder/registry.py).

- `push`: the normalised image (builder/normalize.py) goes to the staging repository by digest; base
  layers are never uploaded (HEAD, else a cross-repository mount from the base repository).
- `pull`: acceptance pulls `<staging>@<digest>` into an engine and checks the pulled image ID.
- `promote`: release tags are PUT with the very manifest bytes served at the accepted digest, after
  every blob is mounted from staging; nothing else can receive a release tag.
"""
from __future__ import annotations

import json
from typing import Any

from builder import log
from builder.errors import BuildFailed, InfraError, PublishError
from builder.normalize import MANIFEST_TYPE, Normalized, blob_path
from builder.registry import Registry, split_repository

BASE_NAME = "org.opencontainers.image.base.name"
BASE_DIGEST = "org.opencontainers.image.base.digest"


def staging_repository(repository: str, staging: str | None = None) -> str:
    """The pins' image.staging, or `<repository>-staging`."""
    return staging or f"{repository}-staging"


def base_of(labels: dict[str, str], auth: tuple[str, str] | None) -> tuple[dict, list[dict]]:
    """The base image's config and its manifest's layer descriptors, from its registry by digest."""
    host, name = split_repository(labels[BASE_NAME])
    reg = Registry(host, auth)
    try:
        manifest = json.loads(reg.manifest_by_digest(name, labels[BASE_DIGEST]))
        config = json.loads(reg.blob(name, manifest["config"]["digest"]))
    except PublishError as err:
        raise BuildFailed(f"base image {labels[BASE_NAME]}@{labels[BASE_DIGEST]}: {err}") from None
    layers = [{"mediaType": d["mediaType"], "size": d["size"], "digest": d["digest"]} for d in manifest["layers"]]
    return config, layers


def push(norm: Normalized, repository: str, base_name: str, auth: tuple[str, str] | None,
         tag: str | None = None) -> str:
    """Push blobs then the manifest by digest (and `tag` if given) to `repository`; return the ref."""
    host, name = split_repository(repository)
    base_host, base_repo = split_repository(base_name)
    reg = Registry(host, auth)
    reg.ping()
    uploaded = mounted = present = 0
    manifest = blob_path(norm.manifest_digest).read_bytes()
    config_digest = json.loads(manifest)["config"]["digest"]
    with log.step(f"push {repository}@{norm.manifest_digest[:19]}"):
        for i, desc in enumerate([*norm.layers, {"digest": config_digest}]):
            digest = desc["digest"]
            if reg.has_blob(name, digest):
                present += 1
            elif i < norm.base_layers:
                if base_host != host or not reg.mount_blob(name, digest, base_repo):
                    raise PublishError(f"{repository}: base layer {digest} is not in the registry and cannot be "
                                       f"mounted from {base_name}; base layers are never re-uploaded")
                mounted += 1
            else:
                path = blob_path(digest)
                if not path.exists():
                    raise PublishError(f"{repository}: blob {digest} is neither in the registry nor in {path.parent}")
                reg.upload_blob(name, digest, str(path))
                uploaded += 1
        reg.put_manifest(name, norm.manifest_digest, manifest, MANIFEST_TYPE)
        if tag:
            reg.put_manifest(name, tag, manifest, MANIFEST_TYPE)
    log.info(f"staged {repository}@{norm.manifest_digest} ({uploaded} uploaded, {mounted} mounted, {present} present)")
    return f"{repository}@{norm.manifest_digest}"


def pull(client: Any, ref: str, expected_id: str | None, auth: tuple[str, str] | None) -> dict:
    """Pull `repo@sha256:...` into the engine; the image ID must equal `expected_id` (when given).
    A digest the registry does not serve is PublishError (exit 1) with one clear line."""
    import docker

    repository, _, digest = ref.partition("@")
    if not digest.startswith("sha256:"):
        raise BuildFailed(f"--image {ref}: expected REPOSITORY@sha256:<64 hex>")
    host, name = split_repository(repository)
    reg = Registry(host, auth)
    reg.ping()
    if reg.tag_digest(name, digest) is None:
        raise PublishError(f"{ref}: the registry {host} does not serve this digest")
    auth_config = {"username": auth[0], "password": auth[1]} if auth else None
    with log.step(f"pull {ref}"):
        try:
            client.api.pull(repository, tag=digest, auth_config=auth_config)
            image_id = client.api.inspect_image(ref)["Id"]
        except docker.errors.APIError as err:
            raise InfraError(f"docker engine: pull {ref}: {str(err)[:300]}") from None
    if expected_id and image_id != expected_id:
        raise PublishError(f"{ref}: pulled image {image_id}, the build made {expected_id}; refusing to accept it")
    return {"ref": ref, "digest": digest, "image_id": image_id}


def promote(staged_ref: str, image_id: str, repository: str, tags: list[str], auth: tuple[str, str] | None) -> dict:
    """Give the accepted staged digest its release tags: mount every blob from staging, PUT the manifest
    bytes served at that digest under each tag. Returns {digest, pushed: {tag: digest}}."""
    staging, _, digest = staged_ref.partition("@")
    s_host, s_name = split_repository(staging)
    host, name = split_repository(repository)
    if s_host != host:
        raise PublishError(f"{staged_ref}: staging and release repositories must share a registry ({s_host} != {host})")
    reg = Registry(host, auth)
    reg.ping()
    manifest = reg.manifest_by_digest(s_name, digest)  # hash-checked: exactly the accepted bytes
    doc = json.loads(manifest)
    if doc.get("config", {}).get("digest") != image_id:
        raise PublishError(f"{staged_ref}: its config is {doc.get('config', {}).get('digest')}, "
                           f"acceptance ran on {image_id}; refusing")
    for desc in [*doc["layers"], doc["config"]]:
        if not reg.has_blob(name, desc["digest"]) and not reg.mount_blob(name, desc["digest"], s_name):
            raise PublishError(f"{repository}: could not mount blob {desc['digest']} from {staging}")
    pushed = {tag: reg.put_manifest(name, tag, manifest, doc.get("mediaType") or MANIFEST_TYPE) for tag in tags}
    return {"digest": digest, "pushed": pushed}
