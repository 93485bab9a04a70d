"""An image's root filesystem from its layers, as enroot builds it: `docker save` streamed to a file,
every layer checked against the config's diff_ids, layers applied in order with whiteouts honoured
(`.wh.<name>` deletes, `.wh..wh..opq` empties a directory of what lower layers put there).

Two independent routes over the same layers: `expected_tree` computes the final tree in memory
(path -> Entry with mode, owner and content sha256); `apply_layers` writes it to a directory.
`dev/*` is left out as enroot does (`tar --exclude='dev/*'`).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from builder.core import files as fs
from builder.core.errors import BadInput
from builder.core.imageref import digest_of, hex_of
from builder.engine import client as engine

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
XATTR = "SCHILY.xattr."
CHUNK = 1 << 20
SMALL = 1 << 18  # tree_of hashes files up to this size inline


@dataclass(frozen=True)
class Entry:
    """One path of a root filesystem: kind f(ile) d(ir) l(ink) or o(ther: device, fifo)."""

    kind: str
    mode: int                 # stat.S_IMODE: permission, setuid, setgid, sticky bits
    uid: int
    gid: int
    sha256: str = ""          # regular files
    target: str = ""          # symlinks
    xattrs: tuple[tuple[str, bytes], ...] = field(default=())
    mtime: int = 0            # seconds, as the layer recorded it: a timestamp .pyc is valid only beside its source's


@dataclass
class SavedImage:
    """A `docker save` tar on disk: the image config and its layer members, lowest first."""

    path: Path
    image_id: str
    config: dict[str, Any]
    layers: list[tarfile.TarInfo]


def save(client: Any, image_id: str, dest: Path) -> SavedImage:
    """Stream `docker save <image_id>` into dest and check that its config hashes to the image ID."""
    with open(dest, "wb") as out:
        found = engine.save_image(client, image_id, out, CHUNK)  # InfraError (exit 3) when the engine fails
    if not found:
        raise BadInput(f"image {image_id}: not in the Docker engine (build or pull it first)")
    return open_saved(dest, image_id)


def from_blobs(config: bytes, blobs: list[Path | None], start: int, image_id: str, dest: Path) -> SavedImage:
    """A `docker save`-shaped tar at dest from the build's own gzip layer blobs (builder/engine/normalize.py), with
    empty placeholders for the first `start` layers (a kept tree stands for them, builder/release/sqsh_trees.py):
    no `docker save` of the whole image. Each layer above is still checked against its diff_id when read."""
    names = [f"{i:03d}/layer.tar" for i in range(len(blobs))]
    with tarfile.open(dest, "w") as tar:
        for i, (name, blob) in enumerate(zip(names, blobs, strict=True)):
            if i < start:
                tar.addfile(tarfile.TarInfo(name))
                continue
            if blob is None:
                raise BadInput(f"layer {i} of {image_id}: not in the blob store")
            with tempfile.TemporaryFile(dir=dest.parent) as raw:
                with gzip.open(blob) as unzipped:
                    shutil.copyfileobj(unzipped, raw, CHUNK)
                info = tarfile.TarInfo(name)
                info.size = raw.tell()
                raw.seek(0)
                tar.addfile(info, raw)
        for name, data in ((f"{hex_of(image_id)}.json", config), ("manifest.json", json.dumps(
                [{"Config": f"{hex_of(image_id)}.json", "RepoTags": [], "Layers": names}]).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return open_saved(dest, image_id)


def open_saved(path: Path, image_id: str) -> SavedImage:
    with tarfile.open(path) as outer:
        manifest = json.loads(_read(outer, "manifest.json"))
        if len(manifest) != 1:
            raise BadInput(f"{path}: expected one image in the saved tar, found {len(manifest)}")
        raw = _read(outer, manifest[0]["Config"])
        digest = digest_of(raw)
        if digest != image_id:
            raise BadInput(f"{path}: the saved config is {digest}, expected the image {image_id}")
        layers = [outer.getmember(name) for name in manifest[0]["Layers"]]
    config = json.loads(raw)
    if len(config.get("rootfs", {}).get("diff_ids", [])) != len(layers):
        raise BadInput(f"{path}: {len(layers)} layers but the config lists another number of diff_ids")
    return SavedImage(path=path, image_id=image_id, config=config, layers=layers)


def _read(outer: tarfile.TarFile, name: str) -> bytes:
    member = outer.extractfile(name)
    if member is None:
        raise BadInput(f"{outer.name!s}: {name} is not a file in the saved tar")
    return member.read()


def _norm(name: str) -> str:
    """A layer path relative to the root ('usr/bin/x'); '' is the root; '..' is refused."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadInput(f"layer member {name!r}: expected a path inside the root, found '..'")
    return "/".join(parts)


def excluded(path: str) -> bool:
    """What enroot leaves out of the rootfs: everything under dev/."""
    return path.startswith("dev/")


def _whiteouts(members: list[tarfile.TarInfo]) -> tuple[list[str], list[str]]:
    """(directories made opaque, paths deleted) by this layer."""
    opaque, deleted = [], []
    for m in members:
        path = _norm(m.name)
        head, _, base = path.rpartition("/")
        if base == OPAQUE:
            opaque.append(head)
        elif base.startswith(WHITEOUT):
            deleted.append(f"{head}/{base[len(WHITEOUT):]}" if head else base[len(WHITEOUT):])
    return opaque, deleted


def _xattrs(member: tarfile.TarInfo) -> tuple[tuple[str, bytes], ...]:
    found = [(k[len(XATTR):], v.encode("utf-8", "surrogateescape"))
             for k, v in member.pax_headers.items() if k.startswith(XATTR)]
    return tuple(sorted(found))


class _Hashing:
    """A read-only stream that hashes what is read (the layer's diff_id)."""

    def __init__(self, raw: IO[bytes]):
        self.raw, self.hash = raw, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.hash.update(data)
        return data


def _layer_stream(outer: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    stream = outer.extractfile(member)
    if stream is None:
        raise BadInput(f"{outer.name!s}: layer {member.name} is not a file")
    return stream


# ---------------------------------------------------------------- in memory


def expected_tree(saved: SavedImage, start: int = 0, tree: dict[str, Entry] | None = None,
                  on_layer: Callable[[int, dict[str, Entry]], None] | None = None) -> dict[str, Entry]:
    """The final tree of the image, computed from the layers without writing a file; each layer's
    sha256 must equal its diff_id in the config. `tree`: that of the first `start` layers (not read
    again); `on_layer(index, tree)` sees the tree after each layer."""
    tree = dict(tree or {})
    diff_ids = saved.config["rootfs"]["diff_ids"]
    with tarfile.open(saved.path) as outer:
        for index, layer in enumerate(saved.layers[start:], start):
            with tarfile.open(fileobj=_layer_stream(outer, layer)) as inner:
                opaque, deleted = _whiteouts(inner.getmembers())
            for directory in opaque:
                _drop(tree, directory, keep_self=True)
            for path in deleted:
                _drop(tree, path, keep_self=False)
            digest = _add_layer(tree, _Hashing(_layer_stream(outer, layer)))
            if digest != diff_ids[index]:
                raise BadInput(f"{saved.path}: layer {index} ({layer.name}) hashes to {digest}, "
                               f"the config says {diff_ids[index]}")
            if on_layer:
                on_layer(index, tree)
    return tree


def _drop(tree: dict[str, Entry], path: str, keep_self: bool) -> None:
    prefix = f"{path}/" if path else ""
    for key in [k for k in tree if k.startswith(prefix) and k != path]:
        del tree[key]
    if not keep_self:
        tree.pop(path, None)


def _add_layer(tree: dict[str, Entry], stream: _Hashing) -> str:
    with tarfile.open(fileobj=stream, mode="r|") as inner:  # type: ignore[call-overload]
        for m in inner:
            path = _norm(m.name)
            base = path.rpartition("/")[2]
            if not path or base.startswith(WHITEOUT) or excluded(path):
                continue
            tree[path] = _entry(inner, m, tree)
    while stream.read(CHUNK):  # the end-of-archive blocks count in the diff_id too
        pass
    return digest_of(stream.hash)


def _entry(inner: tarfile.TarFile, m: tarfile.TarInfo, tree: dict[str, Entry]) -> Entry:
    meta = Entry(kind="o", mode=stat.S_IMODE(m.mode), uid=m.uid, gid=m.gid, xattrs=_xattrs(m), mtime=int(m.mtime))
    if m.isreg():
        fh = inner.extractfile(m)
        digest = hashlib.sha256()
        while fh is not None and (chunk := fh.read(CHUNK)):
            digest.update(chunk)
        return replace(meta, kind="f", sha256=digest.hexdigest())
    if m.islnk():  # same inode as its target: the target's entry, with the time this member gives the inode
        target = tree.get(_norm(m.linkname))
        if target is None or target.kind != "f":
            raise BadInput(f"layer member {m.name!r}: hard link to {m.linkname!r}, which is not a file")
        tree[_norm(m.linkname)] = replace(target, mtime=int(m.mtime))
        return tree[_norm(m.linkname)]
    if m.isdir():
        return replace(meta, kind="d")
    if m.issym():
        return replace(meta, kind="l", target=m.linkname)
    return meta


# ---------------------------------------------------------------- on disk


class SharedInode(Exception):
    """A layer hard-links a file of a lower layer, whose inode the tree may share (builder/release/sqsh_trees.py)."""


def apply_layers(saved: SavedImage, rootfs: Path, start: int = 0, any_xattrs: bool = False,
                 on_layer: Callable[[int, bool], None] | None = None, private_from: int | None = None) -> bool:
    """Write the image's root filesystem into rootfs, empty or holding the tree of the first `start` layers
    (owners, modes, xattrs kept); True when any file carries xattrs. `on_layer(index, any_xattrs)` runs after
    each layer. A layer from `private_from` on that hard-links a file of a lower layer raises SharedInode
    before anything of that link is written."""
    with tarfile.open(saved.path) as outer:
        for index, layer in enumerate(saved.layers[start:], start):
            with tarfile.open(fileobj=_layer_stream(outer, layer)) as inner:
                members = inner.getmembers()
                if private_from is not None and index >= private_from:
                    _own_links_only(members, index)
                opaque, deleted = _whiteouts(members)
                for directory in opaque:
                    for child in _inside(rootfs, directory).iterdir() if _is_dir(rootfs, directory) else ():
                        _remove(child)
                for path in deleted:
                    _remove(_inside(rootfs, path))
                for m in members:
                    any_xattrs |= _extract(inner, m, rootfs)
            if on_layer:
                on_layer(index, any_xattrs)
    return any_xattrs


def _own_links_only(members: list[tarfile.TarInfo], index: int) -> None:
    """Refuse (SharedInode) a hard link to a path this layer did not write before it."""
    written: set[str] = set()
    for m in members:
        if m.islnk() and _norm(m.linkname) not in written:
            raise SharedInode(f"layer {index}: {m.name} hard-links {m.linkname} of a lower layer")
        written.add(_norm(m.name))


def _is_dir(rootfs: Path, path: str) -> bool:
    return _inside(rootfs, path).is_dir() and not _inside(rootfs, path).is_symlink()


def _inside(rootfs: Path, path: str) -> Path:
    """rootfs/path, refusing a path whose parent directories go through a symlink (a layer written by
    an engine never does; following one could leave the rootfs)."""
    if not path:
        return rootfs
    target = rootfs / path
    parent = path.rpartition("/")[0]
    want = os.path.join(os.path.realpath(rootfs), parent) if parent else os.path.realpath(rootfs)
    if os.path.realpath(target.parent) != want:
        raise BadInput(f"layer member {path!r}: its parent goes through a symlink; refusing to follow it")
    return target


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()


# paths were checked above (_inside, no write through a symlink); Python < 3.11.4 (Debian's 3.11.2) has no filters
TRUSTED: dict[str, Any] = {"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}


def _extract(inner: tarfile.TarFile, m: tarfile.TarInfo, rootfs: Path) -> bool:
    path = _norm(m.name)
    base = path.rpartition("/")[2]
    if not path or base.startswith(WHITEOUT) or excluded(path):
        return False
    target = _inside(rootfs, path)
    if not (m.isdir() and _is_dir(rootfs, path)):
        _remove(target)  # never write through an existing file: it may be a hard link of another path
    if m.islnk():
        source = _inside(rootfs, _norm(m.linkname))
        if source.is_symlink() or not source.is_file():
            raise BadInput(f"layer member {m.name!r}: hard link to {m.linkname!r}, which is not a file")
    inner.extract(m, rootfs, set_attrs=True, numeric_owner=True, **TRUSTED)
    xattrs = _xattrs(m)
    for key, value in xattrs:
        os.setxattr(target, key, value, follow_symlinks=False)
    return bool(xattrs)


def set_times(rootfs: Path, tree: dict[str, Entry], root_mtime: int) -> None:
    """Every path's modification time as its entry says, the root's `root_mtime`: writing a later layer changed
    its parents' times, and a kept tree's directories are new (builder/release/sqsh_trees.py)."""
    for path, entry in tree.items():
        os.utime(rootfs / path, ns=(entry.mtime * 10**9, entry.mtime * 10**9), follow_symlinks=False)
    os.utime(rootfs, ns=(root_mtime * 10**9, root_mtime * 10**9))


def walk(rootfs: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry under rootfs, sorted; the root itself is not listed."""
    for top, dirs, files in os.walk(rootfs):
        dirs.sort()
        rel = os.path.relpath(top, rootfs)
        for name in sorted(dirs + files):
            path = name if rel == "." else f"{rel}/{name}"
            yield path, os.lstat(os.path.join(top, name))


def tree_of(rootfs: Path) -> dict[str, Entry]:
    """The Entry of every path under a directory (e.g. one unsquashfs wrote). Large files are hashed on every
    core (hashlib releases the GIL); small ones here, where a thread hand-off would cost more than the hash."""
    tree: dict[str, Entry] = {}
    large: list[tuple[str, str]] = []
    for path, st in walk(rootfs):
        full = os.path.join(rootfs, path)
        xattrs = tuple(sorted((k, os.getxattr(full, k, follow_symlinks=False))
                              for k in os.listxattr(full, follow_symlinks=False)))
        kind, digest, target = "o", "", ""
        if stat.S_ISREG(st.st_mode):
            kind = "f"
            if st.st_size > SMALL:
                large.append((path, full))
            else:
                digest = fs.sha256_file(full)
        elif stat.S_ISDIR(st.st_mode):
            kind = "d"
        elif stat.S_ISLNK(st.st_mode):
            kind, target = "l", os.readlink(full)
        tree[path] = Entry(kind=kind, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid, sha256=digest,
                           target=target, xattrs=xattrs, mtime=int(st.st_mtime))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for (path, _), digest in zip(large, pool.map(lambda p: fs.sha256_file(p[1]), large), strict=True):
            tree[path] = replace(tree[path], sha256=digest)
    return tree
