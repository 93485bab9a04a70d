"""What the JIT compilers put in the compile caches during a recipe run: one record per cache entry.

Triton writes one directory per compiled kernel (named by its cache key) holding `<kernel>.json` metadata
beside the IR and the binary; the record takes the kernel name, the key, the compiler version, the key config
and the Triton-IR hash from there. Any other file in a cache directory is listed by path and sha256.
Origin, judged by content: the cache's files are hashed at the start; an entry whose files are all there with the
same sha256 after the run came with the image (or the container); one there at the start whose files changed
(rewritten, added or removed) changed during the run; a new one was compiled (or written) during the run."""
import importlib.metadata as md
import json
import os
from typing import Any

from acceptance import procfs

LIMIT = 64  # entries per gate: the evidence stays bounded
CONFIG = ("num_warps", "num_stages", "num_ctas", "maxnreg", "cluster_dims", "enable_fp_fusion",
          "default_dot_input_precision", "ptx_version", "shared")


def listing(dirs: list[str]) -> dict[str, str | None]:
    """Every file under the cache directories with its sha256 (None: unreadable): the state before a run."""
    found: dict[str, str | None] = {}
    for top in dirs:
        for root, _, files in os.walk(top):
            for name in files:
                path = os.path.join(root, name)
                found[path] = procfs.sha256(path)
    return found



def _installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def triton_entry(meta_path: str) -> dict[str, Any] | None:
    """One Triton cache entry from its metadata JSON; None when the file is not Triton kernel metadata."""
    try:
        with open(meta_path) as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not {"name", "hash"} <= set(meta) or os.path.basename(meta_path).startswith("__grp__"):
        return None
    folder, stem = os.path.dirname(meta_path), os.path.basename(meta_path)[:-len(".json")]
    target: dict[str, Any] = meta["target"] if isinstance(meta.get("target"), dict) else {}
    version = meta.get("triton_version")
    return {"compiler": "triton", "kernel": meta["name"], "cache_key": meta["hash"], "entry": folder,
            "compiler_version": version or _installed("triton"),
            "compiler_version_from": "cache metadata" if version else "installed triton",
            "target": {k: target.get(k) for k in ("backend", "arch", "warp_size") if k in target},
            "config": {k: meta[k] for k in CONFIG if k in meta},
            "ttir_sha256": procfs.sha256(os.path.join(folder, stem + ".ttir")),
            "binary_sha256": procfs.sha256(os.path.join(folder, stem + ".cubin"))
            or procfs.sha256(os.path.join(folder, stem + ".hsaco"))}


SHIPPED = "present at start (shipped in the image)"
CHANGED = "changed during the run"


def _origin(paths: set[str], before: dict[str, str | None], after: dict[str, str | None],
            new: str) -> tuple[str, list[str]]:
    """(origin, the files that differ) of an entry: `paths`, its files before or after the run."""
    if not any(p in before for p in paths):
        return new, []
    changed = sorted(p for p in paths if before.get(p, "absent") != after.get(p, "absent"))
    return (CHANGED if changed else SHIPPED), changed


FROM_CACHE = "from the node-local cache (this image, commits, GPU architecture and rank)"


def compiled(dirs: list[str], before: dict[str, str | None], node_local: bool = False) -> dict[str, Any]:
    """The cache entries after a run, each with its origin judged by content against `before` (listing's):
    shipped (the same bytes at start; with `node_local`, from the node-local cache), changed during the run, or
    compiled / written during the run."""
    after = listing(dirs)
    entries: list[dict[str, Any]] = []
    claimed: set[str] = set()
    for path in sorted(after):
        if path.endswith(".json"):
            entry = triton_entry(path)
            if entry is not None:
                folder = {p for p in (*after, *before) if os.path.dirname(p) == entry["entry"]}
                entry["origin"], changed = _origin(folder, before, after, "compiled during the run")
                entry["origin"] = FROM_CACHE if node_local and entry["origin"] == SHIPPED else entry["origin"]
                if changed:
                    entry["changed"] = changed
                entries.append(entry)
                claimed.update(folder)
    others = []
    for path in sorted(set(after) - claimed):
        origin, _ = _origin({path}, before, after, "written during the run")
        origin = FROM_CACHE if node_local and origin == SHIPPED else origin
        others.append({"compiler": "unknown", "file": path, "sha256": after[path], "origin": origin})
    every = entries + others
    start = [{"file": p, "sha256": h} for p, h in sorted(before.items())]
    return {"dirs": dirs, "at_start": {"count": len(start), "files": start[:LIMIT]},
            "entries": every[:LIMIT], "count": len(every), "kernels": sorted({e["kernel"] for e in entries}),
            "changed": sum(1 for e in every if e["origin"] == CHANGED)}
