"""A root filesystem on this host as a GateRunner, through runc (the OCI runtime the Docker engine itself runs
containers with): one fresh container per gate straight from the directory, read-only, in new pid, network,
ipc, uts and mount namespaces (the network namespace holds only loopback: network none), tmpfs /tmp and
cache, killed at the timeout and always deleted. Nothing is imported into an engine: the export's smoke
(builder/runners/sqsh_smoke.py) runs the provenance gate on the unpacked .sqsh this way."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from builder.core.constants import CACHE_ENV
from builder.core.errors import InfraError
from builder.core.records import DockerFacts, GateResult
from builder.gating.runner import gate_command, result_from_output
from builder.gating.settings import Call
from builder.pins.model import Pins
from builder.runners.docker_runner import TMPFS

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # what Docker gives an image without PATH
NAMESPACES = ("pid", "network", "ipc", "uts", "mount")
PREFIX = "builder-smoke-"


def runc() -> str:
    found = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin")
    if found is None:
        raise InfraError("runc not found: the .sqsh smoke runs its gate with runc (the Docker engine's OCI runtime);"
                         " install it, or export with --no-smoke")
    return found


def environment(rootfs: Path) -> list[str]:
    """KEY=VALUE: Docker's default PATH, the tree's /etc/environment (what enroot applies at start), the caches."""
    env = {"PATH": PATH}
    path = rootfs / "etc/environment"
    for line in path.read_text().splitlines() if path.is_file() else []:
        key, sep, value = line.partition("=")
        if sep and key:
            env[key] = value
    env.update(CACHE_ENV)
    return [f"{k}={v}" for k, v in env.items()]


def spec(rootfs: Path, args: list[str], env: list[str], hostname: str) -> dict[str, Any]:
    """The OCI runtime config of one gate: the tree read-only as root, with Docker's default capabilities less mknod."""
    mounts = [{"destination": "/proc", "type": "proc", "source": "proc"},
              {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
              {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
              {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
              {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}]
    for where, options in TMPFS.items():
        mounts.append({"destination": where, "type": "tmpfs", "source": "tmpfs", "options": options.split(",")})
    caps = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
            "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_AUDIT_WRITE"]  # Docker's default set, less mknod
    return {"ociVersion": "1.0.2", "hostname": hostname, "root": {"path": str(rootfs), "readonly": True},
            "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": args, "env": env, "cwd": "/tmp",
                        "noNewPrivileges": True,
                        "capabilities": {k: caps for k in ("bounding", "effective", "permitted")}},
            "mounts": mounts,
            "linux": {"namespaces": [{"type": t} for t in NAMESPACES],
                      "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
                      "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]}}


class RuncRunner:
    """Gates in fresh runc containers of one root filesystem directory."""

    kind = "runc"

    def __init__(self, pins: Pins, rootfs: Path):
        self.pins, self.rootfs, self.binary = pins, Path(rootfs), runc()
        self.version = _version(self.binary)

    def run(self, call: Call, timeout_s: int) -> tuple[GateResult, dict[str, Any]]:
        name, gate = PREFIX + uuid.uuid4().hex[:12], call.gate
        bundle = Path(tempfile.mkdtemp(prefix=f"{name}."))
        command = gate_command(self.pins, gate, json.dumps(call.wire()))
        config = spec(self.rootfs, command, environment(self.rootfs), name[-12:])
        (bundle / "config.json").write_text(json.dumps(config))
        timed_out = False
        try:
            try:
                proc = subprocess.run([self.binary, "run", "--bundle", str(bundle), name], capture_output=True,
                                      text=True, stdin=subprocess.DEVNULL, timeout=timeout_s)
                rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired as late:
                timed_out, rc = True, None
                stdout, stderr = _text(late.stdout), _text(late.stderr)
        finally:
            subprocess.run([self.binary, "delete", "--force", name], capture_output=True, timeout=60)
            shutil.rmtree(bundle, ignore_errors=True)
        facts = {"runtime": "runc", "version": self.version, "container": name, "rootfs": str(self.rootfs),
                 "read_only": True, "network": "none", "networks": ["none"], "tmpfs": TMPFS, "exit_code": rc}
        if timed_out:
            facts["timed_out"] = True
        return result_from_output(gate, rc, stdout, stderr, timed_out, timeout_s), facts

    def describe(self) -> DockerFacts:
        return DockerFacts(runner="runc", engine=self.version, network="none (a network namespace with loopback only)",
                           home="tmpfs (HOME is the empty cache tmpfs)", tmpfs=TMPFS, env=CACHE_ENV)

    def close(self) -> None:
        """Each run deletes its own container (`run` waits for it)."""


def _version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    return out.splitlines()[0] if out else "runc"


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
