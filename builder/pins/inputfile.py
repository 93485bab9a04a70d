"""Read an input file (pins, lock, report) safely: one BadInput line naming the file, never a traceback.

Refused: a path that does not exist or loops (symlink loop), anything but a regular file (a FIFO would
block, /dev/zero never ends), a file over `max_bytes` (checked before reading, and again while reading),
and bytes that are not UTF-8.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from builder.core.errors import BadInput
from builder.core.safetext import show

CHUNK = 1 << 20


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    return exc.strerror or type(exc).__name__


def read_bytes(path: str | Path, what: str, max_bytes: int) -> bytes:
    label = show(str(path), 120)[1:-1]
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        reason = _reason(exc) if isinstance(exc, OSError) else "not a valid path"
        raise BadInput(f"{label}: cannot read the {what}: {reason}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise BadInput(f"{label}: cannot read the {what}: {kind}")
    if info.st_size > max_bytes:
        raise BadInput(f"{label}: the {what} has {info.st_size} bytes; at most {max_bytes}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # swapped since the stat above
                raise BadInput(f"{label}: cannot read the {what}: not a regular file")
            chunks, total = [], 0
            while total <= max_bytes:  # in pieces: read(n) would reserve n bytes up front
                chunk = fh.read(min(CHUNK, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
    except OSError as exc:
        raise BadInput(f"{label}: cannot read the {what}: {_reason(exc)}") from None
    if total > max_bytes:
        raise BadInput(f"{label}: the {what} has more than {max_bytes} bytes")
    return b"".join(chunks)


def decode(data: bytes, label: str, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{show(label, 120)[1:-1]}: cannot read the {what}: not UTF-8 (byte {exc.start})") from None


def read_text(path: str | Path, what: str, max_bytes: int) -> str:
    return decode(read_bytes(path, what, max_bytes), str(path), what)
