"""Blobs from one registry to another (crane copy's way): skip what the target has, mount where the hosts match,
else stream through, hashing on the way; a few at a time. Foreign (non-distributable) layers stay where their
`urls` point, as Docker leaves them. A rerun skips the blobs done; a blob cut off starts over."""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from builder.core.errors import PublishError
from builder.core.imageref import digest_of
from builder.engine.registry.operations import Registry

FOREIGN = ("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
           "application/vnd.oci.image.layer.nondistributable.v1.tar",
           "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
           "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd")
WORKERS = 4
CHUNK = 1 << 20


def copy_blobs(source: Registry, source_name: str, target: Registry, target_name: str,
               blobs: list[dict[str, Any]], progress: Callable[[str], None] | None = None) -> dict[str, int]:
    """Make each blob descriptor ({digest, size, mediaType}) present in target_name; counts by what was done
    (present, mounted, copied, foreign) and the bytes moved."""
    counts = {"present": 0, "mounted": 0, "copied": 0, "foreign": 0, "bytes": 0}
    todo = len(blobs)

    def one(blob: dict[str, Any]) -> tuple[str, int]:
        digest = str(blob["digest"])
        if blob.get("mediaType") in FOREIGN and blob.get("urls"):
            return "foreign", 0
        if target.has_blob(target_name, digest):
            return "present", 0
        if source.host == target.host and target.mount_blob(target_name, digest, source_name):
            return "mounted", 0
        return "copied", _stream(source, source_name, target, target_name, digest)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        for done, (what, size) in enumerate(pool.map(one, blobs), 1):
            counts[what] += 1
            counts["bytes"] += size
            if progress:
                progress(f"base blobs {done}/{todo} ({what}, {counts['bytes'] >> 20} MiB moved)")
    return counts


def _stream(source: Registry, source_name: str, target: Registry, target_name: str, digest: str) -> int:
    """GET from the source and PUT to the target in one pass, checking the sha256 before the upload completes."""
    path = f"/v2/{source_name}/blobs/{digest}"
    got = source._request("GET", path, stream=True)
    if got.status_code != 200:
        raise PublishError(f"registry {source.host}: GET {path} answered {got.status_code}, expected 200")
    start = target._request("POST", f"/v2/{target_name}/blobs/uploads/")
    location = start.headers.get("Location", "")
    if start.status_code != 202 or not location:
        raise PublishError(f"registry {target.host}: POST /v2/{target_name}/blobs/uploads/ answered {start.status_code}")
    sha, moved = hashlib.sha256(), [0]

    def chunks() -> Iterator[bytes]:
        with got:
            for data in got.iter_content(CHUNK):
                sha.update(data)
                moved[0] += len(data)
                yield data
        if digest_of(sha) != digest:  # the target refuses the PUT too: its digest check fails
            raise PublishError(f"registry {source.host}: blob {digest} has content {digest_of(sha)}")

    sep = "&" if "?" in location else "?"
    resp = target._request("PUT", f"{location}{sep}digest={digest}", data=chunks(),
                           headers={"Content-Type": "application/octet-stream"})
    if resp.status_code != 201:
        raise PublishError(f"registry {target.host}: copy of {digest} to {target_name} answered {resp.status_code}")
    return moved[0]
