"""A local image's blobs in the cache's image store (`<cache>/oci/`, builder/engine/normalize.py), so that
`staging.push` sends it to a registry by digest: no engine push, no tag on the way (publish's local-image path).

An image this cache normalised is found by the build's manifest digest or its normalise record; any other local
image is read once by `docker save` and each layer gzipped here (level 6, mtime 0: the same image gives the same
manifest digest again), remembered under `<cache>/oci/local/`. Nothing here writes to a registry.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

from builder.core import files as fs
from builder.core import log
from builder.core.errors import InfraError, PublishError
from builder.core.imageref import digest_of, hex_of
from builder.core.options import Settings
from builder.engine import normalize
from builder.engine.normalize import CONFIG_TYPE, GZIP_LEVEL, LAYER_TYPE, Descriptor, blob_path, store


def manifest_of(client: Any, image_id: str, settings: Settings, hint: str | None = None) -> str:
    """The digest of a manifest in the store whose config is `image_id`: `hint` (the build's), a normalise record's,
    one saved before, else the engine's image saved into the store now."""
    for digest in (hint, _remembered(settings, image_id), *_normalised(settings, image_id)):
        if digest and _names(settings, digest, image_id):
            return digest
    return _save(client, image_id, settings)


def stored_manifest(settings: Settings, digest: str) -> bytes:
    """The manifest bytes stored under `digest`, hash-checked."""
    try:
        body = blob_path(settings, digest).read_bytes()
    except OSError:
        body = b""
    if digest_of(body) != digest:
        raise PublishError(f"{digest}: not in the image store {blob_path(settings, digest)}")
    return body


def _names(settings: Settings, digest: str, image_id: str) -> bool:
    """Whether the stored manifest `digest` is there, hashes to its name and has `image_id` as its config."""
    path = blob_path(settings, digest)
    try:
        body = path.read_bytes()
        return digest_of(body) == digest and json.loads(body)["config"]["digest"] == image_id
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _remembered(settings: Settings, image_id: str) -> str | None:
    try:
        return (store(settings, "local") / hex_of(image_id)).read_text().strip()
    except OSError:
        return None


def _normalised(settings: Settings, image_id: str) -> list[str]:
    """Manifest digests the normalise records name for `image_id`, newest first."""
    found = []
    for path in sorted(store(settings, "records").glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("image_id") == image_id:
            found.append(str(record.get("manifest_digest", "")))
    return found


def _save(client: Any, image_id: str, settings: Settings) -> str:
    """`docker save` of the image into the store: each layer gzipped, the config as saved, a manifest over them."""
    import docker  # lazy: the docker SDK is heavy

    try:
        diff_ids = list(client.api.inspect_image(image_id)["RootFS"]["Layers"])
    except docker.errors.APIError as err:
        raise InfraError(f"docker engine: inspect {image_id}: {str(err)[:300]}") from None
    fs.sweep_parts(store(settings, "tmp"))
    work = fs.part_dir(store(settings, "tmp"), "local")
    try:
        with log.step(f"docker save {image_id[:19]} into the image store ({len(diff_ids)} layers)"):
            try:
                tars, config = normalize.save_layers(client, image_id, set(diff_ids), work)
            except docker.errors.APIError as err:
                raise InfraError(f"docker engine: save {image_id}: {str(err)[:300]}") from None
            missing = [d for d in diff_ids if d not in tars]
            if digest_of(config) != image_id or missing:
                raise PublishError(f"docker save {image_id}: expected its config and layers "
                                   f"{', '.join(missing) or '(config)'} in the saved archive")
            layers = [_gzip(settings, tars[d]) for d in diff_ids]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fs.write_atomic(blob_path(settings, image_id), config)
    manifest = normalize.manifest_bytes(Descriptor(CONFIG_TYPE, len(config), image_id), layers)
    digest = digest_of(manifest)
    fs.write_atomic(blob_path(settings, digest), manifest)
    fs.write_atomic(store(settings, "local") / hex_of(image_id), digest + "\n")
    return digest


def _gzip(settings: Settings, tar: Path) -> Descriptor:
    """A layer tar gzipped into the store under its own digest."""
    tmp = fs.part_path(store(settings, "blobs", "sha256") / tar.name)
    try:
        with open(tmp, "wb") as out:
            hashing = normalize._Hashing(out)
            with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=hashing, mtime=0) as gz:
                with open(tar, "rb") as src:
                    shutil.copyfileobj(src, gz, normalize.CHUNK)
        os.replace(tmp, blob_path(settings, hashing.digest()))
    finally:
        tmp.unlink(missing_ok=True)
    return Descriptor(LAYER_TYPE, hashing.size, hashing.digest())
