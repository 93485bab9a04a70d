"""Host commands: run one with its output in a log file; apt-get install without starting services."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from builder.core import log
from builder.core.errors import BuilderError, InfraError
from builder.core.files import tail


def run_logged(argv: list[str], logfile: Path, what: str, error: type[BuilderError] = InfraError,
               env: dict[str, str] | None = None, every: float | None = None) -> None:
    """Run a host command with its output appended to logfile; `error` (one line + the log tail) on failure.
    With `every`, a long command shows its progress on the console (builder/core/log.py `Progress`): at most
    one line every `every` seconds, read from what it wrote to the log."""
    with open(logfile, "ab") as out:
        out.write(("$ " + " ".join(argv) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            rc = proc.wait() if every is None else _follow(proc, logfile, out.tell(), log.Progress(what, logfile, every))
        finally:
            if proc.poll() is None:  # interrupted: the command does not outlive us
                proc.kill()
                proc.wait()
    if rc != 0:
        raise error(f"{what}: exit {rc}; log {logfile}", details=tail(logfile, 10))


def _follow(proc: subprocess.Popen[bytes], logfile: Path, offset: int, progress: log.Progress) -> int:
    """Wait for `proc`, feeding what it appends to `logfile` (from `offset`, whole lines) to `progress`."""
    rest = b""
    with open(logfile, "rb") as read:
        read.seek(offset)
        while True:
            try:
                rc = proc.wait(timeout=min(1.0, progress.every))
            except subprocess.TimeoutExpired:
                rc = None
            data = rest + read.read()
            done, _, rest = data.rpartition(b"\n")
            if len(rest) > 65536:  # a line that never ends (a progress bar): take it as it is
                done, rest = data, b""
            progress.feed(done.decode(errors="replace"))
            if rc is not None:
                return rc


def apt_install(logfile: Path, *packages: str) -> None:
    """apt-get install without letting maintainer scripts start services (policy-rc.d = 101):
    Debian's docker.io would start dockerd with a bridge and docker-registry would listen on
    all addresses."""
    names = " ".join(packages)
    if os.geteuid() != 0:
        raise InfraError(f"{names}: missing; install them as root (apt-get install {names})")
    if not shutil.which("apt-get"):
        raise InfraError(f"{names}: missing and apt-get is not available to install them")
    policy = Path("/usr/sbin/policy-rc.d")
    added_policy = not policy.exists()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        if added_policy:
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
        with log.step(f"apt-get install {names}"):
            run_logged(["apt-get", "update"], logfile, "apt-get update", env=env, every=log.EVERY_S)
            run_logged(["apt-get", "install", "-y", "--no-install-recommends", *packages], logfile,
                       f"apt-get install {names}", env=env, every=log.EVERY_S)
    finally:
        if added_policy:
            policy.unlink(missing_ok=True)
