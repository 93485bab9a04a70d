"""`builder rebuild --check REPORT.json`: rebuild from the pins alone with no cache and compare digests.

Works from any report naming the image digest: its build record, the digest `accept --image` pulled,
or its image ID alone. Same image ID and manifest digest -> exit 0. Otherwise exit 1 with a file-level
diff of every layer that differs (path, type, mode, uid/gid, size, sha256, mtime, link), in the spirit of `diffoci --semantic`;
the result is also written into the report (`rebuild`).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from builder.core import files as fs
from builder.core import log
from builder.core.errors import BadInput, BuildFailed
from builder.core.imageref import ImageRef, by_digest
from builder.core.options import Settings
from builder.core.records import BuiltImage, Report
from builder.engine import client as engine
from builder.engine import normalize
from builder.engine.registry import Registry
from builder.report import document as report_mod

FIELDS = ("type", "mode", "uid", "gid", "size", "sha256", "mtime", "link")
TYPES = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink",
         tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block", tarfile.FIFOTYPE: "fifo"}
MAX_ENTRIES = 200  # per layer, in the report


def listing(blob: bytes) -> dict[str, dict[str, Any]]:
    """path -> {type, mode, uid, gid, size, sha256, mtime, link} of one gzip layer."""
    out = {}
    with tarfile.open(fileobj=gzip.GzipFile(fileobj=io.BytesIO(blob))) as tar:
        for m in tar:
            sha = ""
            if m.isreg():
                src = tar.extractfile(m)
                sha = hashlib.sha256(src.read() if src else b"").hexdigest()
            out["/" + m.name.lstrip("./")] = {"type": TYPES.get(m.type, repr(m.type)), "mode": oct(m.mode),
                                              "uid": m.uid, "gid": m.gid, "size": m.size, "sha256": sha,
                                              "mtime": int(m.mtime), "link": m.linkname}
    return out


def diff_listings(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per path that differs: only in one side, or the fields that differ."""
    entries = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a is None or b is None:
            entries.append({"path": path, "change": "added" if a is None else "removed", **(b or a or {})})
        elif a != b:
            entries.append({"path": path, "change": "modified",
                            "fields": {f: {"report": a[f], "rebuild": b[f]} for f in FIELDS if a[f] != b[f]}})
    return entries


class _Blobs:
    """Blobs of the image a report names: the local store first, else the registry (staged ref)."""

    def __init__(self, ref: str, settings: Settings):
        self.settings = settings
        self.reg: Registry | None = None
        self.name = ""
        if ref:
            image = ImageRef(ref)
            self.name = image.repository
            self.reg = Registry.from_settings(image.registry, settings)

    def get(self, digest: str) -> bytes:
        path = normalize.blob_path(self.settings, digest)
        if path.exists():
            return path.read_bytes()
        if self.reg is None:
            raise BuildFailed(f"blob {digest}: not in {path.parent} and the report names no staged image to fetch it")
        return self.reg.blob(self.name, digest)


def expected(report: Report, report_path: Path) -> tuple[str, str, str]:
    """(manifest digest, image ID, ref to fetch blobs from) the report names: its build record, else the
    digest acceptance pulled (`accept --image` reports), else its image ID alone (manifest "")."""
    pulled = report.acceptance.pulled if report.acceptance else None
    ref = str((report.build.staged if report.build else None) or (pulled.ref if pulled else ""))
    manifest = (report.build.manifest_digest if report.build else "") or (pulled.digest if pulled else "")
    by_ref = by_digest(ref)
    manifest = manifest or (str(by_ref.digest) if by_ref else "")
    image_id = report.image_id if report.image_id.startswith("sha256:") else ""
    if not manifest and not image_id:
        raise BadInput(f"{report_path}: build.manifest_digest, acceptance.pulled.digest or image_id: "
                       "expected a report naming the image digest")
    return manifest, image_id, ref


def compare(report: Report, rebuilt_manifest: str, rebuilt_id: str, settings: Settings,
            report_path: Path = Path("report.json")) -> dict[str, Any]:
    """The comparison record: digests, and per differing layer its file-level diff."""
    want_manifest, want_id, ref = expected(report, report_path)
    same = (not want_manifest or rebuilt_manifest == want_manifest) and (not want_id or rebuilt_id == want_id)
    result: dict[str, Any] = {"status": "same" if same else "different",
                              "report": {"image_id": want_id or "unknown", "manifest_digest": want_manifest or "unknown"},
                              "rebuild": {"image_id": rebuilt_id, "manifest_digest": rebuilt_manifest}, "layers": []}
    if same or not want_manifest:
        return result
    blobs = _Blobs(ref, settings)
    local = normalize.blob_path
    old = json.loads(blobs.get(want_manifest))
    new = json.loads(local(settings, rebuilt_manifest).read_bytes())
    old_layers, new_layers = old["layers"], new["layers"]
    for i in range(max(len(old_layers), len(new_layers))):
        a = old_layers[i]["digest"] if i < len(old_layers) else None
        b = new_layers[i]["digest"] if i < len(new_layers) else None
        if a == b:
            continue
        entries = diff_listings(listing(blobs.get(a)) if a else {}, listing(local(settings, b).read_bytes()) if b else {})
        result["layers"].append({"index": i, "report_digest": a, "rebuild_digest": b, "files": len(entries),
                                 "entries": entries[:MAX_ENTRIES]})
    old_cfg = json.loads(blobs.get(old["config"]["digest"]))
    new_cfg = json.loads(local(settings, new["config"]["digest"]).read_bytes())
    result["config"] = sorted(k for k in set(old_cfg) | set(new_cfg) if k != "rootfs" and old_cfg.get(k) != new_cfg.get(k))
    return result


def recorded_digest(report: Report, report_path: Path) -> str:
    """The manifest digest the report names for its image (a build record or an accepted pulled digest;
    "" when it names only the image ID); BadInput when it names neither."""
    return expected(report, report_path)[0]


def rebuild_tag(tag: str) -> str:
    """The rebuild's own tag beside the run's (a reference is at most 128 characters of tag)."""
    ref = ImageRef(tag)
    return str(ref.tagged(f"rebuild-{ref.tag}"[:128]))


def record(report: Report, report_path: Path, built: BuiltImage, tag: str, settings: Settings,
           client: engine.Client) -> dict[str, Any]:
    """Compare the rebuild with the report's image, drop the rebuild tag, write `rebuild` into the report."""
    try:
        result = compare(report, built.manifest_digest, built.image_id, settings, report_path)
        result["log"] = built.log_path  # the rebuild's build log (its .steps.json beside it)
    finally:
        engine.remove_image(client, tag)  # the rebuild tag only; an equal image keeps its own tag
    report = report.model_copy(update={"rebuild": result})
    paths = report_mod.write(report, report_path.parent)
    if paths["json"].resolve() != report_path.resolve():
        fs.write_atomic(report_path, report.model_dump_json(indent=2) + "\n")
    for layer in result["layers"]:
        names = ", ".join(e["path"] for e in layer["entries"][:5])
        log.info(f"layer {layer['index']}: {layer['files']} paths differ: {names}")
    return result
