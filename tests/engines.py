"""A second Docker engine for tests: its own dockerd with its own --data-root, --exec-root, pidfile and
unix socket, no bridge, no iptables (like the shared one). `second_engine()` starts it and always stops
it, removes every container it holds and deletes its directories, also when the test fails."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.fixture_types import DockerClient

START_TIMEOUT_S = 90


@dataclass
class Engine:
    url: str
    root: Path
    pid: int
    log: Path


def _client(url: str) -> DockerClient:
    import docker

    return docker.DockerClient(base_url=url, timeout=600)


@contextlib.contextmanager
def second_engine() -> Iterator[Engine]:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise RuntimeError("dockerd is not installed")
    root = Path(tempfile.mkdtemp(prefix="dk2-", dir="/tmp"))  # short: unix socket paths are limited
    log = root / "dockerd.log"
    sock = root / "docker.sock"
    cmd = [dockerd, f"--data-root={root}/data", f"--exec-root={root}/exec", f"--pidfile={root}/docker.pid",
           f"--host=unix://{sock}", "--bridge=none", "--iptables=false", "--ip-masq=false",
           f"--config-file={root}/daemon.json"]
    # its own engine ID: 20.10 derives it from a key kept in /etc/docker unless the config names another
    (root / "daemon.json").write_text(json.dumps({"deprecated-key-path": f"{root}/key.json"}))
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    engine = Engine(url=f"unix://{sock}", root=root, pid=proc.pid, log=log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"second dockerd exited ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                if sock.exists() and _client(engine.url).ping():
                    break
            except Exception:  # not up yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"second dockerd did not answer in {START_TIMEOUT_S} s: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield engine
    finally:
        _stop(engine, proc)


def _stop(engine: Engine, proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(Exception):
        client = _client(engine.url)
        for container in client.containers.list(all=True):
            container.remove(force=True)
        client.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: dockerd and its containerd
            proc.wait(timeout=30)
    _unmount_under(engine.root)
    shutil.rmtree(engine.root, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    """Mounts a killed dockerd may leave (overlay, shm), deepest first."""
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1] for line in fh if line.split()[1].startswith(str(root) + "/")]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def running(url: str) -> bool:
    try:
        return bool(_client(url).ping())
    except Exception:
        return False
