"""Faults from the world around a run, as the CLI reports them: SIGTERM becomes `Interrupted` (exit 130,
cleanup in `finally` blocks runs first), a full disk or a broken engine/registry connection is an
infrastructure error (exit 3), and `point(name)` is a fail point for the fault-matrix tests.

A fail point is inert unless its name starts with BUILDER_FAILPOINT: then the process prints `failpoint <name>` on
stderr and waits while the file BUILDER_FAILPOINT_HOLD exists (at most FAILPOINT_MAX_S), so a test can
stop an engine, fill a disk or send a signal exactly there (like gofail's `sleep` terms).
"""
from __future__ import annotations

import errno
import os
import signal
import sys
import time
from types import FrameType

from builder.core import options
from builder.core.errors import Interrupted
from builder.core.safetext import clip

DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)
FAILPOINT_MAX_S = 300.0


def interrupt_on_sigterm() -> None:
    """SIGTERM raises Interrupted once in the main thread; a second one while cleaning up is ignored."""

    def handler(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)


def infrastructure(err: BaseException) -> bool:
    """A full or broken disk, an HTTP/socket failure (requests, urllib3), or a Docker engine error."""
    if isinstance(err, OSError) and err.errno in DISK_ERRNOS or disk_message(err):
        return True
    module = type(err).__module__.split(".")[0]
    return module in ("requests", "urllib3", "docker", "http") or isinstance(err, (ConnectionError, TimeoutError))


def disk_message(err: BaseException | str) -> str:
    """The disk error a library or tool reported as text only (libgit2: 'failed to write out file: No space
    left on device'; uv: '... (os error 28)')."""
    text = str(err)
    return next((os.strerror(code) for code in DISK_ERRNOS if os.strerror(code) in text), "")


def describe(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno in DISK_ERRNOS:
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        return clip(f"disk: {os.strerror(err.errno or 0)}{where}", 250)
    if disk_message(err):
        return clip(f"disk: {' '.join(str(err).split())}", 250)
    return clip(f"{type(err).__name__}: {' '.join(str(err).split())}", 250)


def point(name: str) -> None:
    """A fail point (see the module docstring); nothing happens unless `name` starts with BUILDER_FAILPOINT."""
    wanted, hold = options.failpoint()
    if not wanted or not name.startswith(wanted):
        return
    print(f"failpoint {name}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + FAILPOINT_MAX_S
    while hold and os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)
