"""Local infrastructure: a Docker engine and a registry on 127.0.0.1:5000 (`builder setup`).

Both `ensure_*` functions are idempotent: they start something only when nothing answers, and
return a small dict saying what was found or started and where its log is.  Run as
`builder setup` (prints that dict as JSON on stdout).

Rules kept here: the engine runs with `--bridge=none --iptables=false --ip-masq=false` (no bridge
network is ever created), the registry listens on 127.0.0.1 only, and nothing is pulled.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder.core import commands, log
from builder.core import files as fs
from builder.core.errors import InfraError
from builder.core.options import Settings
from builder.engine import client as engine

Info = dict[str, Any]

REGISTRY_HOST = "127.0.0.1"
REGISTRY_PORT = 5000
DOCKERD_ARGS = ["--bridge=none", "--iptables=false", "--ip-masq=false"]
REGISTRY_BIN = "/usr/bin/docker-registry"


def registry_url() -> str:
    """host:port of the local registry (no scheme), as used in image references."""
    return f"{REGISTRY_HOST}:{REGISTRY_PORT}"


# --------------------------------------------------------------------------- helpers


def _spawn(argv: list[str], logfile: Path) -> int:
    """Start a detached process (own session, survives this one), output appended to logfile."""
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    return proc.pid


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    if not fs.alive(pid):
        return False
    # a zombie child of ours counts as dead
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True


def _pids_named(name: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().strip() == name:
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def tcp_listeners(port: int) -> list[str]:
    """Local addresses listening on TCP `port` (from /proc/net/tcp{,6}), e.g. ['127.0.0.1']."""
    found = []
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            rows = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state = fields[1], fields[3]
            if state != "0A":  # LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            if int(port_hex, 16) != port:
                continue
            if v6:
                raw = bytes.fromhex(addr_hex)
                # /proc stores each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                found.append(str(ipaddress.IPv6Address(raw)))
            else:
                found.append(".".join(str(b) for b in bytes.fromhex(addr_hex)[::-1]))
    return found


# --------------------------------------------------------------------------- engine


def _engine_answers(settings: Settings) -> bool:
    try:
        engine.connect(settings, timeout=5)
        return True
    except InfraError:
        return False


def _engine_info(settings: Settings) -> Info:
    client = engine.connect(settings, timeout=10)
    version = client.version()
    return {"version": version.get("Version"), "api_version": version.get("ApiVersion")}


def _wait(predicate: Callable[[], bool], timeout: float, what: str, logfile: Path | None,
          pid: int | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if pid is not None and not _alive(pid):
            raise InfraError(f"{what}: exited while starting; log {logfile}",
                             details=fs.tail(logfile) if logfile else [])
        time.sleep(0.5)
    raise InfraError(f"{what}: not answering after {timeout:.0f} s; log {logfile}",
                     details=fs.tail(logfile) if logfile else [])


def ensure_engine(settings: Settings) -> Info:
    """Make sure a Docker engine answers; install docker.io and start dockerd when needed."""
    with fs.locked(settings.cache("logs") / ".engine.lock"):
        return _ensure_engine(settings)


def _ensure_engine(settings: Settings) -> Info:
    def answers() -> bool:
        return _engine_answers(settings)

    if answers():
        info = {"engine": "found", **_engine_info(settings), "log": None, "pid": None}
        log.info(f"docker engine: already running (version {info['version']})")
        return info

    docker_host = settings.docker_host or ""
    if docker_host and docker_host not in ("unix:///var/run/docker.sock", "unix://var/run/docker.sock"):
        raise InfraError(f"DOCKER_HOST={docker_host}: engine not answering; not starting a local dockerd for it")

    logfile = settings.cache("logs") / "dockerd.log"
    running = _pids_named("dockerd")
    if running:  # started but not answering yet (e.g. just launched): wait for it, start nothing
        log.info(f"docker engine: dockerd (pid {running[0]}) is running but not answering yet; waiting")
        _wait(answers, settings.engine_timeout_s, "docker engine", None)
        return {"engine": "found", **_engine_info(settings), "log": None, "pid": running[0]}

    installed = False
    if not shutil.which("dockerd"):
        commands.apt_install(settings.run_log("apt"), "docker.io")
        installed = True
        if not shutil.which("dockerd"):
            raise InfraError("dockerd: still missing after apt-get install docker.io")
    if os.geteuid() != 0:
        raise InfraError("dockerd: must be started as root; run `builder setup` as root")

    with log.step("start dockerd"):
        pid = _spawn([shutil.which("dockerd") or "dockerd", *DOCKERD_ARGS], logfile)
        _wait(answers, settings.engine_timeout_s, "docker engine (dockerd)", logfile, pid)
    info = {"engine": "started", **_engine_info(settings), "log": str(logfile), "pid": pid, "installed": installed}
    log.info(f"docker engine: started dockerd {' '.join(DOCKERD_ARGS)} (pid {pid}), log {logfile}")
    return info


# --------------------------------------------------------------------------- registry


def registry_answers(timeout: float = 2.0) -> bool:
    from builder.engine import registry  # lazy: requests is slow to import; start-up

    return registry.answers(registry_url(), timeout)


def _registry_config_text(data_dir: Path) -> str:
    # JSON is valid YAML; keeps us independent of a YAML emitter.
    config = {
        "version": 0.1,
        "log": {"level": "info", "fields": {"service": "registry"}},
        "storage": {
            "filesystem": {"rootdirectory": str(data_dir)},
            "delete": {"enabled": True},
            # upload sessions a killed push left open (the publish journal cancels its own on the next command)
            "maintenance": {"uploadpurging": {"enabled": True, "age": "24h", "interval": "1h", "dryrun": False}},
        },
        "http": {"addr": registry_url(), "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }
    return json.dumps(config, indent=2) + "\n"


def _check_loopback_only() -> None:
    bad = [a for a in tcp_listeners(REGISTRY_PORT) if a not in ("127.0.0.1", "::1")]
    if bad:
        raise InfraError(f"port {REGISTRY_PORT}: something listens on {', '.join(bad)};"
                         " the registry must listen on 127.0.0.1 only")


def ensure_registry(settings: Settings) -> Info:
    """Make sure a registry answers on 127.0.0.1:5000 (only); start docker-registry when needed."""
    with fs.locked(settings.cache("registry") / ".setup.lock"):
        return _ensure_registry(settings)


def _ensure_registry(settings: Settings) -> Info:
    config = settings.cache("registry") / "config.yml"
    if registry_answers():
        _check_loopback_only()
        pid_file, logfile = settings.cache("registry") / "registry.pid", settings.cache("logs") / "registry.log"
        pid = int(pid_file.read_text()) if pid_file.exists() and pid_file.read_text().strip().isdigit() else None
        ours = _alive(pid) and pid in _pids_named("docker-registry")
        log.info(f"registry: already answering on http://{registry_url()}/v2/"
                 + (f" (pid {pid}, log {logfile})" if ours else " (not started by this cache)"))
        return {"registry": "found", "url": registry_url(), "log": str(logfile) if ours else None,
                "pid": pid if ours else None, "config": str(config) if ours else None}

    installed = False
    if not Path(REGISTRY_BIN).exists():
        commands.apt_install(settings.run_log("apt"), "docker-registry")
        installed = True
        if not Path(REGISTRY_BIN).exists():
            raise InfraError(f"{REGISTRY_BIN}: still missing after apt-get install docker-registry")

    data_dir = settings.cache("registry", "data")
    text = _registry_config_text(data_dir)
    if not config.exists() or config.read_text() != text:
        config.write_text(text)
    logfile = settings.cache("logs") / "registry.log"
    with log.step("start docker-registry"):
        pid = _spawn([REGISTRY_BIN, "serve", str(config)], logfile)
        _wait(registry_answers, settings.registry_timeout_s, f"registry on {registry_url()}", logfile, pid)
    (settings.cache("registry") / "registry.pid").write_text(f"{pid}\n")
    _check_loopback_only()
    log.info(f"registry: started {REGISTRY_BIN} serve {config} on {registry_url()} (pid {pid}), "
             f"data {data_dir}, log {logfile}")
    return {"registry": "started", "url": registry_url(), "log": str(logfile), "pid": pid,
            "config": str(config), "data": str(data_dir), "installed": installed}


def ensure_tools(settings: Settings) -> Info:
    """Host tools of later stages: mksquashfs/unsquashfs (squashfs-tools) for `export-sqsh`."""
    if shutil.which("mksquashfs") and shutil.which("unsquashfs"):
        return {"squashfs-tools": "found"}
    with fs.locked(settings.cache("logs") / ".apt.lock"):
        if not (shutil.which("mksquashfs") and shutil.which("unsquashfs")):
            commands.apt_install(settings.run_log("apt"), "squashfs-tools")
    if not shutil.which("mksquashfs"):
        raise InfraError("mksquashfs: still missing after apt-get install squashfs-tools")
    return {"squashfs-tools": "installed"}


def missing_packages(engine_answers: bool) -> list[str]:
    """The Debian packages set-up would install, one apt-get round for all: the engine (unless one answers), the
    registry, the host tools, debootstrap and pigz (the demo base's build and push; a second round costs another
    `apt-get update`)."""
    wanted = {"docker.io": engine_answers or shutil.which("dockerd"),
              "docker-registry": registry_answers() or Path(REGISTRY_BIN).exists(),
              "squashfs-tools": shutil.which("mksquashfs") and shutil.which("unsquashfs"),
              "debootstrap": shutil.which("debootstrap"), "pigz": shutil.which("pigz")}
    return [package for package, found in wanted.items() if not found]


def ensure_all(settings: Settings) -> Info:
    """Engine, registry, host tools (what is missing installed in one apt-get round first); returns
    {'engine': {...}, 'registry': {...}, 'tools': {...}}."""
    missing = missing_packages(_engine_answers(settings))
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        with fs.locked(settings.cache("logs") / ".apt.lock"), log.step("setup: packages"):
            commands.apt_install(settings.run_log("apt"), *missing)
    with log.step("setup: docker engine"):
        found_engine = ensure_engine(settings)
    with log.step("setup: registry"):
        registry = ensure_registry(settings)
    with log.step("setup: host tools"):
        tools = ensure_tools(settings)
    return {"engine": found_engine, "registry": registry, "tools": tools}
