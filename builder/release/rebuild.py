"""`builder rebuild --check REPORT.json`: rebuild from the pins alone with no cache and compare digests.

Same image ID and manifest digest -> exit 0. Otherwise exit 1 with a file-level diff of every layer
that differs (path, type, mode, uid/gid, size, sha256, mtime, link), in the spirit of `diffoci --semantic`;
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
from builder.core.options import Settings
from builder.core.records import Report
from builder.engine import normalize
from builder.engine.registry import Registry, split_repository
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
            host, self.name = split_repository(ref.partition("@")[0])
            self.reg = Registry.from_settings(host, settings)

    def get(self, digest: str) -> bytes:
        path = normalize.blob_path(self.settings, digest)
        if path.exists():
            return path.read_bytes()
        if self.reg is None:
            raise BuildFailed(f"blob {digest}: not in {path.parent} and the report names no staged image to fetch it")
        return self.reg.blob(self.name, digest)


def compare(report: Report, rebuilt_manifest: str, rebuilt_id: str, settings: Settings) -> dict[str, Any]:
    """The comparison record: digests, and per differing layer its file-level diff."""
    assert report.build is not None
    same = rebuilt_manifest == report.build.manifest_digest and rebuilt_id == report.image_id
    result: dict[str, Any] = {"status": "same" if same else "different",
                              "report": {"image_id": report.image_id, "manifest_digest": report.build.manifest_digest},
                              "rebuild": {"image_id": rebuilt_id, "manifest_digest": rebuilt_manifest}, "layers": []}
    if same:
        return result
    blobs = _Blobs(report.build.staged or (report.acceptance.pulled.get("ref", "") if report.acceptance else ""),
                   settings)
    local = normalize.blob_path
    old = json.loads(blobs.get(report.build.manifest_digest))
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


def check(report_path: Path, settings: Settings) -> dict[str, Any]:
    """Rebuild the report's pins with no cache (under a separate tag), compare, write `rebuild` into the
    report. Returns the comparison; the caller turns `different` into exit 1."""
    from builder.engine import client as engine
    from builder.image import build, render
    from builder.pins import model as pins_mod
    from builder.sources import resolve as sources

    report = report_mod.load(report_path)
    if report.build is None or not report.build.manifest_digest:
        raise BadInput(f"{report_path}: build.manifest_digest: expected a report of a normalised build")
    pins = pins_mod.load(report.sources.pins_path)
    resolved = sources.resolve(pins, settings)
    rendered = render.render(pins, resolved, settings)
    repository, _, tag = rendered.tag.rpartition(":")
    rendered = rendered.model_copy(update={"tag": f"{repository}:rebuild-{tag}"[: len(repository) + 129]})
    with log.step("rebuild --nocache"):
        built = build.build(rendered, settings, nocache=True, echo=False)
    try:
        result = compare(report, built.manifest_digest, built.image_id, settings)
    finally:
        engine.remove_image(engine.connect(settings), build.local_tag(rendered, settings))  # this run's tag only
    report.rebuild = result
    paths = report_mod.write(report, report_path.parent)
    if paths["json"].resolve() != report_path.resolve():
        fs.write_atomic(report_path, report.model_dump_json(indent=2) + "\n")
    for layer in result["layers"]:
        names = ", ".join(e["path"] for e in layer["entries"][:5])
        log.info(f"layer {layer['index']}: {layer['files']} paths differ: {names}")
    return result
