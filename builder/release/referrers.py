"""Attach DSSE envelopes to an image in a registry as OCI 1.1 artifacts, and find them again.

Each envelope is a one-layer artifact manifest whose `subject` is the image manifest.  Where the
registry answers the referrers API (GET /v2/<name>/referrers/<digest>, or OCI-Subject on push) it keeps
the index itself; otherwise (Debian's docker-registry 2.8) the referrers tag schema is used: the tag
`sha256-<hex>` holds an image index listing the artifacts.  The image's own manifest is never touched.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from builder.core import faults
from builder.core.errors import PublishError
from builder.core.imageref import digest_of, hex_of
from builder.engine.registry import Registry, get_json, push_blob, put_manifest

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_DATA = b"{}"
DSSE_TYPE = "application/vnd.dsse.envelope.v1+json"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"


def fallback_tag(digest: str) -> str:
    """The referrers tag schema: 'sha256:<hex>' -> 'sha256-<hex>'."""
    return f"sha256-{hex_of(digest)}"


def _descriptor(media_type: str, data: bytes, digest: str) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


Note = Callable[[str, str], None]  # ("upload", session location) or ("artifact", digest), told before the write


def _quiet(kind: str, value: str) -> None:
    pass


def attach(reg: Registry, name: str, subject: dict[str, Any], envelope: bytes, predicate_type: str,
           note: Note | None = None) -> dict[str, Any]:
    """Push one envelope as an artifact whose subject is `subject` (a descriptor of the image manifest);
    returns the artifact's descriptor (as listed in a referrers index)."""
    note = note or _quiet
    empty = upload(reg, name, EMPTY_DATA, note)
    layer = upload(reg, name, envelope, note)
    annotations = {PREDICATE_ANNOTATION: predicate_type,
                   "org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": DSSE_TYPE,
        "config": _descriptor(EMPTY, EMPTY_DATA, empty),
        "layers": [{**_descriptor(DSSE_TYPE, envelope, layer), "annotations": {PREDICATE_ANNOTATION: predicate_type}}],
        "subject": subject, "annotations": annotations,
    }
    data = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()

    digest = digest_of(data)
    note("artifact", digest)
    resp = put_manifest(reg, name, digest, data, OCI_MANIFEST)
    faults.point("publish: artifact")
    descriptor = {**_descriptor(OCI_MANIFEST, data, digest), "artifactType": DSSE_TYPE, "annotations": annotations}
    if resp.headers.get("OCI-Subject") != subject["digest"] and not _answers_referrers(reg, name, subject["digest"]):
        _add_to_fallback_index(reg, name, subject["digest"], descriptor)
    return descriptor


def upload(reg: Registry, name: str, data: bytes, note: Note) -> str:
    """A blob unless the registry has it: its upload session noted (and the fault point) before the PUT."""
    def session(target: str) -> None:
        note("upload", target)
        faults.point("publish: blob upload")
    return push_blob(reg, name, data, on_session=session)


def _answers_referrers(reg: Registry, name: str, digest: str) -> bool:
    resp = reg._request("GET", f"/v2/{name}/referrers/{digest}", headers={"Accept": OCI_INDEX})
    return resp.status_code == 200 and resp.headers.get("Content-Type", "").startswith(OCI_INDEX)


def _add_to_fallback_index(reg: Registry, name: str, subject_digest: str, descriptor: dict[str, Any]) -> None:
    tag = fallback_tag(subject_digest)
    index = get_json(reg, f"/v2/{name}/manifests/{tag}", OCI_INDEX) or {
        "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    if index.get("mediaType") != OCI_INDEX:
        raise PublishError(f"{reg.host}/{name}:{tag}: holds {index.get('mediaType')}, expected an OCI index")
    index["manifests"] = [m for m in index.get("manifests", []) if m.get("digest") != descriptor["digest"]]
    index["manifests"].append(descriptor)
    data = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    put_manifest(reg, name, tag, data, OCI_INDEX)


def discover(reg: Registry, name: str, digest: str) -> list[dict[str, Any]]:
    """Descriptors of the artifacts that refer to `digest`: referrers API first, else the fallback tag."""
    resp = reg._request("GET", f"/v2/{name}/referrers/{digest}", headers={"Accept": OCI_INDEX})
    index = None
    if resp.status_code == 200 and resp.headers.get("Content-Type", "").startswith(OCI_INDEX):
        index = resp.json()
    if index is None:
        index = get_json(reg, f"/v2/{name}/manifests/{fallback_tag(digest)}", OCI_INDEX) or {}
    return [m for m in index.get("manifests", []) if m.get("artifactType") == DSSE_TYPE]


def fetch_envelope(reg: Registry, name: str, descriptor: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(artifact manifest, envelope) of one referrer; blobs are checked against their digests."""
    got = reg.manifest(name, descriptor["digest"])
    if got["computed"] != descriptor["digest"]:
        raise PublishError(f"{reg.host}/{name}@{descriptor['digest']}: served content is {got['computed']}")
    manifest = json.loads(got["content"])
    layers = manifest.get("layers") or []
    if len(layers) != 1 or layers[0].get("mediaType") != DSSE_TYPE:
        raise PublishError(f"{reg.host}/{name}@{descriptor['digest']}: expected one {DSSE_TYPE} layer")
    return manifest, json.loads(reg.blob(name, layers[0]["digest"]))
