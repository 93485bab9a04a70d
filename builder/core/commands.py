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
               env: dict[str, str] | None = None) -> None:
    """Run a host command with its output appended to logfile; `error` (one line + the log tail) on failure."""
    with open(logfile, "ab") as out:
        out.write(("$ " + " ".join(argv) + "\n").encode())
        out.flush()
        rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    if rc != 0:
        raise error(f"{what}: exit {rc}; log {logfile}", details=tail(logfile, 10))


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
            run_logged(["apt-get", "update"], logfile, "apt-get update", env=env)
            run_logged(["apt-get", "install", "-y", "--no-install-recommends", *packages], logfile,
                       f"apt-get install {names}", env=env)
    finally:
        if added_policy:
            policy.unlink(missing_ok=True)
