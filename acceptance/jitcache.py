"""What the JIT compilers put in the compile caches during a recipe run: one record per cache entry.

Triton writes one directory per compiled kernel (named by its cache key) holding `<kernel>.json` metadata
beside the IR and the binary; the record takes the kernel name, the key, the compiler version, the key config
and the Triton-IR hash from there. Any other new file in a cache directory is listed by path and sha256.
Origin: an entry already there before the run came with the image (or the container); a new one was compiled
during the run."""
import hashlib
import importlib.metadata as md
import json
import os
from typing import Any

LIMIT = 64  # entries per gate: the evidence stays bounded
CONFIG = ("num_warps", "num_stages", "num_ctas", "maxnreg", "cluster_dims", "enable_fp_fusion",
          "default_dot_input_precision", "ptx_version", "shared")


def listing(dirs: list[str]) -> set[str]:
    """Every file under the cache directories (the state before a run)."""
    found: set[str] = set()
    for top in dirs:
        for root, _, files in os.walk(top):
            found.update(os.path.join(root, f) for f in files)
    return found


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None


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
            "ttir_sha256": _sha256(os.path.join(folder, stem + ".ttir")),
            "binary_sha256": _sha256(os.path.join(folder, stem + ".cubin")) or _sha256(os.path.join(folder, stem + ".hsaco"))}


def compiled(dirs: list[str], before: set[str]) -> dict[str, Any]:
    """The cache entries after a run, each with its origin (at start = shipped, else compiled in the run)."""
    after = listing(dirs)
    entries: list[dict[str, Any]] = []
    claimed: set[str] = set()
    for path in sorted(after):
        if path.endswith(".json"):
            entry = triton_entry(path)
            if entry is not None:
                entry["origin"] = "present at start (shipped in the image)" if path in before else "compiled during the run"
                entries.append(entry)
                claimed.update(p for p in after if os.path.dirname(p) == entry["entry"])
    others = [{"compiler": "unknown", "file": p, "sha256": _sha256(p),
               "origin": "present at start (shipped in the image)" if p in before else "written during the run"}
              for p in sorted(after - claimed)]
    every = entries + others
    return {"dirs": dirs, "at_start": "empty" if not before else f"{len(before)} files",
            "entries": every[:LIMIT], "count": len(every), "kernels": sorted({e["kernel"] for e in entries})}
