"""The unpacked tree of an image's base layers, kept for the next `.sqsh` export on the same base.

Layers are content-addressed, so the tree after layers 1..k is keyed by the sha256 of their diff IDs (a chain). An
export whose first k diff IDs match starts from a hard-linked copy of that tree and its entries, and applies only
the layers above (builder/release/sqsh.py). The layers below are not read again: the kept tree was built from layers
whose hashes were checked against the same diff IDs. The .sqsh is still written from the whole tree and checked
file by file, so it is byte-identical to a cold export.

Every file of a copied tree shares its inode with the cache; the layers above only replace files (sqsh_rootfs removes
before it writes). A hard link across layers would change a shared inode's attributes: the export then goes cold
(sqsh_rootfs.SharedInode). An entry is built in a part directory and renamed into place only after its export passed
both checks; the KEEP most recently used entries are kept.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from builder.core import files as fs
from builder.core.constants import SOURCE_DATE_EPOCH
from builder.release.sqsh_rootfs import Entry, set_times

KEEP = 2
FORMAT = "sqsh-tree-2"


@dataclass
class Tree:
    """A kept tree: its first `count` layers, the directory, the entries and whether any file had xattrs."""

    count: int
    rootfs: Path
    entries: dict[str, Entry]
    xattrs: bool


def key(diff_ids: list[str]) -> str:
    return hashlib.sha256("\n".join([FORMAT, *diff_ids]).encode()).hexdigest()[:32]


def find(root: Path, diff_ids: list[str]) -> Tree | None:
    """The kept tree of the longest prefix of these layers, if any (marked as just used)."""
    for count in range(len(diff_ids), 0, -1):
        entry = root / key(diff_ids[:count])
        try:
            meta = json.loads((entry / "tree.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("diff_ids") != diff_ids[:count]:
            continue
        os.utime(entry)
        entries = {path: _entry(row) for path, row in meta["entries"].items()}
        return Tree(count=count, rootfs=entry / "rootfs", entries=entries, xattrs=bool(meta["xattrs"]))
    return None


def link_copy(src: Path, dest: Path) -> None:
    """dest as a copy of the tree src: directories made anew (mode, owner, xattrs), everything else hard-linked."""
    _copy_dir(src, dest)
    for top, dirs, files in os.walk(src):
        rel = os.path.relpath(top, src)
        into = dest if rel == "." else dest / rel
        for name in dirs:
            if os.path.islink(os.path.join(top, name)):
                os.link(os.path.join(top, name), into / name, follow_symlinks=False)
            else:
                _copy_dir(Path(top) / name, into / name)
        for name in files:
            os.link(os.path.join(top, name), into / name, follow_symlinks=False)


def _copy_dir(src: Path, dest: Path) -> None:
    st = os.lstat(src)
    dest.mkdir()
    os.chown(dest, st.st_uid, st.st_gid)
    os.chmod(dest, st.st_mode & 0o7777)
    for name in os.listxattr(src, follow_symlinks=False):
        os.setxattr(dest, name, os.getxattr(src, name, follow_symlinks=False), follow_symlinks=False)


def snapshot(root: Path, rootfs: Path, diff_ids: list[str], entries: dict[str, Entry], xattrs: bool) -> Path:
    """A part directory holding a hard-linked copy of rootfs and its entries, to `keep` once the export passed."""
    part = fs.part_dir(root, "tree")
    link_copy(rootfs, part / "rootfs")
    set_times(part / "rootfs", entries, SOURCE_DATE_EPOCH)  # the copied directories are new
    meta = {"diff_ids": diff_ids, "xattrs": xattrs, "entries": {path: _row(e) for path, e in entries.items()}}
    (part / "tree.json").write_text(json.dumps(meta, separators=(",", ":")))
    return part


def keep(root: Path, part: Path) -> None:
    """Rename the snapshot into place (another export may have kept the same one first), then drop the least
    recently used entries beyond KEEP."""
    diff_ids = json.loads((part / "tree.json").read_text())["diff_ids"]
    try:
        part.rename(root / key(diff_ids))
    except OSError:
        shutil.rmtree(part, ignore_errors=True)
    kept = sorted((p for p in root.iterdir() if p.is_dir() and not fs.PART_RX.match(p.name)),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for old in kept[KEEP:]:
        gone = old.with_name(f".{old.name}.{os.getpid()}.evict{fs.PART}")  # out of find's sight at once
        with contextlib.suppress(OSError):  # another export evicted it first
            old.rename(gone)
            shutil.rmtree(gone, ignore_errors=True)


def _row(e: Entry) -> list[object]:
    return [e.kind, e.mode, e.uid, e.gid, e.sha256, e.target, [[k, v.hex()] for k, v in e.xattrs], e.mtime]


def _entry(row: list[object]) -> Entry:
    kind, mode, uid, gid, sha256, target, xattrs, mtime = row
    assert isinstance(xattrs, list)
    return Entry(kind=str(kind), mode=int(str(mode)), uid=int(str(uid)), gid=int(str(gid)), sha256=str(sha256),
                 target=str(target), xattrs=tuple((str(k), bytes.fromhex(str(v))) for k, v in xattrs),
                 mtime=int(str(mtime)))
