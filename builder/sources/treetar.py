"""Deterministic export of a commit's tree (no work tree) as a tar stream, and a per-file manifest.

Same commit -> same bytes anywhere: entries sorted by path (directories as "dir/"), directories
included, mtime = the commit's committer time, uid/gid 0, no user/group names, modes as git
stores them (0644/0755 files, 0755 dirs), symlinks as stored, GNU tar format, no compression.
Blobs are read one at a time straight from the object database.
"""
import hashlib
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pygit2

from builder.core import files as fs
from builder.core.errors import BadInput

TREE, LINK, GITLINK = 0o040000, 0o120000, 0o160000
FILE, SYMLINK, DIR = b"0", b"2", b"5"
BLOCK, RECORD = tarfile.BLOCKSIZE, tarfile.RECORDSIZE
# modules(path, sha) -> the repository holding submodule commit sha checked out at path
Modules = Callable[[str, str], pygit2.Repository]


@dataclass
class Entry:
    path: bytes  # full path below the export root, no trailing slash
    kind: str  # dir | file | link
    mode: int
    data: bytes = b""  # file content or link target; empty for dirs


@dataclass
class ExportStats:
    sha256: str
    files: int  # regular files and symlinks
    size: int  # bytes written


def open_repo(repo: pygit2.Repository | str | Path) -> pygit2.Repository:
    return repo if isinstance(repo, pygit2.Repository) else pygit2.Repository(str(repo))


def commit_of(repo: pygit2.Repository, commit: object) -> pygit2.Commit:
    try:
        return repo[pygit2.Oid(hex=str(commit))].peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError):
        raise BadInput(f"{repo.path}: commit {commit} not found") from None


def _name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _check_link(path: bytes, target: bytes) -> None:
    """Reject a symlink whose target leaves the tree (absolute or climbing above the root)."""
    where = _name(path)
    if target.startswith(b"/"):
        raise BadInput(f"{where}: symlink target {_name(target)!r} is absolute; expected a path inside the tree")
    depth = path.count(b"/")  # directories above the link, below the root
    for part in target.split(b"/"):
        if part == b"..":
            depth -= 1
            if depth < 0:
                raise BadInput(f"{where}: symlink target {_name(target)!r} escapes the tree")
        elif part not in (b"", b"."):
            depth += 1


def _stays_inside(links: dict[bytes, bytes], path: bytes, target: bytes) -> bool:
    """Resolve target from the link's directory the way the kernel would, following the tree's
    other symlinks; False if it climbs above the root (or loops)."""
    parts = path.split(b"/")[:-1]
    todo = target.split(b"/")
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in (b"", b"."):
            continue
        if part == b"..":
            if not parts:
                return False
            parts.pop()
            continue
        parts.append(part)
        nested = links.get(b"/".join(parts))
        if nested is not None:
            hops += 1
            if hops > 40 or nested.startswith(b"/"):
                return False
            parts.pop()
            todo = nested.split(b"/") + todo
    return True


def entries(repo: pygit2.Repository, tree: pygit2.Tree, modules: "Modules | None" = None) -> Iterator[Entry]:
    """walk(), then check that no symlink leaves the tree through another symlink."""
    links: dict[bytes, bytes] = {}
    for entry in walk(repo, tree, modules):
        if entry.kind == "link":
            links[entry.path] = entry.data
        yield entry
    for path, target in links.items():
        if not _stays_inside(links, path, target):
            raise BadInput(f"{_name(path)}: symlink target {_name(target)!r} escapes the tree through another symlink")


def walk(repo: pygit2.Repository, tree: pygit2.Tree, modules: Modules | None = None,
         base: bytes = b"") -> Iterator[Entry]:
    """Every entry below tree in path order, submodules expanded from their own repositories."""
    read = repo.odb.read
    items = sorted(tree, key=lambda e: e.raw_name + b"/" if e.filemode in (TREE, GITLINK) else e.raw_name)
    for item in items:
        path = base + item.raw_name
        mode = item.filemode
        if mode == TREE:
            yield Entry(path, "dir", 0o755)
            yield from walk(repo, repo[item.id], modules, path + b"/")
        elif mode == GITLINK:
            if modules is None:
                raise BadInput(f"{_name(path)}: submodule at {item.id} needs its mirror; none given")
            sub = modules(_name(path), str(item.id))
            yield Entry(path, "dir", 0o755)
            yield from walk(sub, commit_of(sub, item.id).tree, modules, path + b"/")
        elif mode == LINK:
            target = read(item.id)[1]
            _check_link(path, target)
            yield Entry(path, "link", 0o777, target)
        else:
            yield Entry(path, "file", 0o755 if mode & 0o111 else 0o644, read(item.id)[1])


@contextmanager
def fast_reads() -> Iterator[None]:
    """Skip libgit2's re-hash of every object read (git itself does not re-hash on read either);
    objects were verified when the fetch indexed their pack. Process-wide, so restored after."""
    pygit2.option(pygit2.enums.Option.ENABLE_STRICT_HASH_VERIFICATION, False)
    try:
        yield
    finally:
        pygit2.option(pygit2.enums.Option.ENABLE_STRICT_HASH_VERIFICATION, True)


class _Pipe:
    """Batches chunks, then hashes and writes each batch; close() returns (sha256, size).
    (A writer thread was measured slower on two busy cores, so this stays on one thread.)"""

    def __init__(self, fileobj: BinaryIO | None, batch: int = 1 << 20):
        self.fileobj, self.batch = fileobj, batch
        self.hash = hashlib.sha256()
        self.chunks: list[bytes] = []
        self.pending = 0
        self.queued = 0  # bytes put so far

    def put(self, data: bytes) -> None:
        self.chunks.append(data)
        self.pending += len(data)
        self.queued += len(data)
        if self.pending >= self.batch:
            self._flush()

    def _flush(self) -> None:
        buf = b"".join(self.chunks)
        self.chunks, self.pending = [], 0
        self.hash.update(buf)
        if self.fileobj is not None:
            self.fileobj.write(buf)

    def close(self) -> tuple[str, int]:
        self._flush()
        return self.hash.hexdigest(), self.queued


def _num(n: int, width: int) -> bytes:
    """Octal, zero-padded, NUL-terminated; base-256 when it does not fit (GNU)."""
    if n < 8 ** (width - 1):
        return b"%0*o\0" % (width - 1, n)
    return b"\x80" + n.to_bytes(width - 1, "big")


def _block(name: bytes, kind: bytes, mode: int, mtime: int, size: int, link: bytes) -> bytes:
    head = b"".join((
        name.ljust(100, b"\0"), _num(mode, 8), _num(0, 8), _num(0, 8), _num(size, 12), _num(mtime, 12),
        b" " * 8, kind, link.ljust(100, b"\0"), b"ustar  \0", b"\0" * 247,
    ))
    return head[:148] + b"%06o\0 " % sum(head) + head[156:]


def _header(name: bytes, kind: bytes, mode: int, mtime: int, size: int = 0, link: bytes = b"") -> bytes:
    """One GNU tar header (written here, not by tarfile, so no Python version changes the bytes);
    names or link targets over 100 bytes get a ././@LongLink record first."""
    out = b""
    for long_kind, value in ((b"K", link), (b"L", name)):
        if len(value) > 100:
            data = value + b"\0"
            out += _block(b"././@LongLink", long_kind, 0, 0, len(data), b"") + _pad(data)
    return out + _block(name[:100], kind, mode, mtime, size, link[:100])


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % BLOCK)


def export_tar(repo: pygit2.Repository | str | Path, commit: object, fileobj: BinaryIO | None, prefix: str = "",
               modules: Modules | None = None) -> ExportStats:
    """Write the tree of commit as a deterministic tar to fileobj (or only hash it if None).
    Streams as it goes: after a BadInput (e.g. a symlink chain found escaping at the end) the
    output is incomplete and must be discarded (export_file does that)."""
    repo = open_repo(repo)
    top = commit_of(repo, commit)
    mtime = top.committer.time
    out = _Pipe(fileobj)
    base = b""
    for part in prefix.strip("/").split("/") if prefix.strip("/") else []:
        base += part.encode("utf-8", "surrogateescape") + b"/"
        out.put(_header(base, DIR, 0o755, mtime))
    files = 0
    with fast_reads():
        for entry in entries(repo, top.tree, modules):
            name = base + entry.path
            if entry.kind == "file":
                out.put(_header(name, FILE, entry.mode, mtime, len(entry.data)))
                out.put(_pad(entry.data))
            elif entry.kind == "link":
                out.put(_header(name, SYMLINK, entry.mode, mtime, link=entry.data))
            else:
                out.put(_header(name + b"/", DIR, entry.mode, mtime))
            files += entry.kind != "dir"
    out.put(b"\0" * (2 * BLOCK))
    out.put(b"\0" * (-(out.queued) % RECORD))
    digest, size = out.close()
    return ExportStats(digest, files, size)


def file_manifest(repo: pygit2.Repository | str | Path, commit: object,
                  modules: Modules | None = None) -> dict[str, str]:
    """{path: sha256} for every regular file and symlink (hash of the link target) at commit."""
    repo = open_repo(repo)
    tree = commit_of(repo, commit).tree
    with fast_reads():
        return {_name(e.path): hashlib.sha256(e.data).hexdigest() for e in entries(repo, tree, modules) if e.kind != "dir"}


def export_file(repo: pygit2.Repository | str | Path, commit: object, path: Path, prefix: str = "",
                modules: Modules | None = None) -> ExportStats:
    """export_tar into a file, written next to it first and renamed into place."""
    with fs.atomic_path(Path(path)) as tmp, open(tmp, "wb") as fh:
        stats = export_tar(repo, commit, fh, prefix, modules)
    return stats
