"""File helpers shared by the stages: sha256 of a file, advisory locks, the tail of a log, what a live run holds."""
from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def locked(path: Path, exclusive: bool = True, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Advisory lock (flock) on `path` (created if missing) so concurrent callers do the work once;
    `waiting` is called once before blocking when another process holds it."""
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fh, mode)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


PART = ".part"  # suffix of every file being written; never read as a result


def part_path(dest: Path) -> Path:
    """A private temporary name beside `dest` (same file system, so the rename is atomic): hidden, with
    this process's ID, so `sweep_parts` can tell a dead writer's leftover from a live one's."""
    return dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{PART}")


@contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Write to the yielded temporary path; it is renamed onto `dest` only when the block ends without an
    error (also an interruption), and removed otherwise: readers see the old file or the whole new one."""
    tmp = part_path(dest)
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(dest: Path, data: bytes | str) -> None:
    with atomic_path(dest) as tmp:
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_parts(directory: Path) -> list[Path]:
    """Remove the temporary files and directories (`part_path`, `part_dir`) that a killed writer left in
    `directory`; a live process's are kept. Returns what was removed."""
    removed: list[Path] = []
    try:
        names = list(directory.iterdir())
    except OSError:
        return removed
    for path in names:
        match = PART_RX.match(path.name)
        if match and not alive(int(match[1])):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def part_dir(parent: Path, prefix: str = "work") -> Path:
    """A private work directory under `parent` that `sweep_parts` removes once its process is gone."""
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{prefix}.{os.getpid()}.", suffix=PART, dir=parent))


PART_RX = re.compile(r"^\..*?\.(\d+)\.[^.]*\.part$")


_HELD: dict[str, IO[str]] = {}  # path -> open file whose shared lock this process holds (released at exit)


def _release_all() -> None:
    """At exit: close the held files (the locks go with them), so no open file is left to the interpreter."""
    for key in list(_HELD):
        _HELD.pop(key).close()


atexit.register(_release_all)


def hold(path: Path) -> None:
    """Hold a shared advisory lock on `path` (created if missing) until `release` or this process ends:
    `builder gc` leaves alone what a live process holds (`held`)."""
    key = str(path)
    if key not in _HELD:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a")
        fcntl.flock(fh, fcntl.LOCK_SH)
        _HELD[key] = fh


def release(path: Path) -> None:
    fh = _HELD.pop(str(path), None)
    if fh is not None:
        fh.close()  # closing drops the lock


def held(path: Path) -> bool:
    """Whether a live process (this one included) holds `path` (`hold`); a missing file is held by none."""
    try:
        fh = open(path)
    except OSError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False
