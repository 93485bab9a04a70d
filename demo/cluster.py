"""A two-node Slurm cluster on this host (n1, n2: two slurmd): what a site provides, for the demo and the tests
(not the tool).

`python -m demo.cluster start|stop|status [DIR]` (default DIR: <cache>/cluster, the builder's cache: the checkout's
`.cache` or `$BUILDER_CACHE`). `start` first installs the Debian packages of what is missing (slurm-wlm, slurmdbd,
munge, mariadb-server, charliecloud-runtime) as `builder setup` installs Docker: apt-get with no service started;
what cannot be installed is one line saying what to do. Everything lives under DIR:
a munge key and `munged` on its own socket, a private MariaDB (`mariadbd`, 127.0.0.1 only, its own data
directory) behind `slurmdbd` so that `sacct` reads jobs and steps from Slurm's own accounting record, and
`slurmctld` + two `slurmd` from a generated `slurm.conf` naming this host, each node with the host's whole CPU count
(so the CPUs do not add up: docs/cluster.md says why that is harmless),
`ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`. Every daemon listens on 127.0.0.1 only
(`CommunicationParameters=NoInAddrAny,NoCtldInAddrAny`; MariaDB `--bind-address`). Clients find it through
`SLURM_CONF=DIR/etc/slurm.conf` (`env()`). `start` also mounts fusectl (a gate task aborts its own FUSE connection there
when its server is gone: builder/runners/slurm_runtimes.py) and waits until the nodes are idle; `stop` ends the daemons it
started (by their pid files) and leaves the state for the next start.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from builder.core import commands, log
from builder.core import files as fs
from builder.core.errors import BuilderError, InfraError
from builder.core.options import Settings
from builder.core.safetext import fit

CLUSTER = "demo"
PARTITION = "gates"
PORTS = {"slurmctld": 6917, "slurmd": 6918, "slurmdbd": 6919, "mariadb": 6920}
# Two nodes on this host, one slurmd each (`slurmd -N <node>`), each on its own port with its own spool, pid and log
# (`%n` in slurm.conf) and its own node-local directory (<root>/nodes/<node>/local: a node's local disk).
NODES = ("n1", "n2")
NODE_PORT = 16821  # n1; n2 the next, ...
RESV_PORTS = "12000-12999"  # srun --resv-ports: the port a step's ranks meet on (MpiParams=ports)
DAEMONS = ("mariadb", "munged", "slurmdbd", "slurmctld", *(f"slurmd-{n}" for n in NODES))  # start order
# each program the cluster runs, by the Debian package that ships it
PACKAGES = {"munged": "munge", "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server",
            "slurmdbd": "slurmdbd", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "srun": "slurm-wlm",
            "sacct": "slurm-wlm", "sinfo": "slurm-wlm", "scontrol": "slurm-wlm", "ch-run": "charliecloud-runtime"}


@dataclass(frozen=True)
class Cluster:
    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    def pid_file(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"

    def local_pattern(self) -> str:
        """Every node's local disk (node-local staging and JIT caches), `%n` the node, as acceptance.slurm takes it."""
        return str(self.root / "nodes" / "%n" / "local")

    def node_local(self, node: str) -> Path:
        return Path(self.local_pattern().replace("%n", node))

    def env(self) -> dict[str, str]:
        """What a client (srun, sbatch, sacct, scancel, the builder) needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf), "USER": os.environ.get("USER") or "root"}


def default_root(settings: Settings | None = None) -> Path:
    """<cache>/cluster: under the builder's cache like everything else (the checkout's `.cache`)."""
    return (settings or Settings.from_env()).cache("cluster")


def missing() -> list[str]:
    """The Debian packages of the programs that are not on the PATH."""
    return sorted({package for program, package in PACKAGES.items() if not shutil.which(program)})


def ensure_installed(settings: Settings) -> list[str]:
    """Install what is missing, as `builder setup` installs Docker (apt-get, services not started, its progress
    lines); the packages installed. InfraError, one line saying what to do, when they cannot be."""
    if not missing():
        return []
    with log.step("setup: slurm cluster packages"), fs.locked(settings.cache("logs") / ".apt.lock"):
        wanted = missing()  # another process may have installed them meanwhile
        if wanted:
            commands.apt_install(settings.run_log("apt"), *wanted)
    still = [program for program in PACKAGES if not shutil.which(program)]
    if still:
        raise InfraError(f"local cluster: {', '.join(still)} still missing after apt-get install {' '.join(wanted)};"
                         " put /usr/sbin on the PATH or install them by hand")
    return wanted


def slurm_conf(c: Cluster, host: str, cpus: int, memory_mb: int) -> str:
    r = c.root
    nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={NODE_PORT + i} CPUs={cpus} "
                      f"RealMemory={memory_mb // len(NODES)} State=UNKNOWN" for i, n in enumerate(NODES))
    return f"""# generated by demo/cluster.py
ClusterName={CLUSTER}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={PORTS['slurmctld']}
SlurmdPort={PORTS['slurmd']}
MpiParams=ports={RESV_PORTS}
TaskProlog={r}/etc/taskprolog
SlurmdParameters=config_overrides
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
AuthType=auth/munge
AuthInfo=socket={c.munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={c.pid_file('slurmctld')}
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=100000
MinJobAge=300
KillWait=5
InactiveLimit=0
JobCompType=jobcomp/filetxt
JobCompLoc={r}/log/jobcomp.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={PORTS['slurmdbd']}
AccountingStoragePass={c.munge_socket}
JobAcctGatherType=jobacct_gather/none
{nodes}
PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def slurmdbd_conf(c: Cluster) -> str:
    return f"""# generated by demo/cluster.py
AuthType=auth/munge
AuthInfo=socket={c.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={PORTS['slurmdbd']}
SlurmUser=root
PidFile={c.pid_file('slurmdbd')}
LogFile={c.root}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={PORTS['mariadb']}
StorageUser=root
StorageLoc=slurm_acct_db
"""


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def configure(c: Cluster) -> None:
    """The key and config files; the munge key is made once and kept."""
    for sub in ("etc", "munge", "run", "state", "spool", "log", "db"):
        (c.root / sub).mkdir(parents=True, exist_ok=True)
    (c.root / "munge").chmod(0o700)
    key = c.root / "etc" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20) // 2
    _write(c.conf, slurm_conf(c, socket.gethostname().split(".")[0], os.cpu_count() or 1, memory_mb))
    _write(c.root / "etc" / "slurmdbd.conf", slurmdbd_conf(c), 0o600)
    # a site's TaskProlog: what <root>/nodes/<node>/taskprolog.env says (`export NAME=value` lines) reaches that
    # node's tasks; empty unless a test plants a node whose environment differs
    _write(c.root / "etc" / "taskprolog", f'#!/bin/sh\nf="{c.root}/nodes/$SLURMD_NODENAME/taskprolog.env"\n'
           '[ -f "$f" ] && cat "$f"\nexit 0\n', 0o755)


def _alive(c: Cluster, daemon: str) -> int | None:
    try:
        pid = int(c.pid_file(daemon).read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _wait(what: str, check: object, seconds: float, logs: Path | None = None, every: float = 0.2) -> None:
    """Until check() holds, every `every` seconds (at least 1 s where check() runs Slurm clients: slurm.pauses)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(every)
    raise InfraError(f"local cluster: {what} not ready after {seconds:.0f} s" + (f"; its log in {logs}" if logs else ""))


def _run(argv: list[str], c: Cluster, what: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, env={**c.env(), **(env or {})}, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise InfraError(f"local cluster: {what}: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_daemon(c: Cluster, daemon: str) -> None:
    """Start one daemon unless it runs (each detaches and writes its pid file)."""
    if _alive(c, daemon):
        return
    r = c.root
    if daemon == "mariadb":
        data = r / "db" / "data"
        if not (data / "mysql").is_dir():
            _run(["mariadb-install-db", f"--datadir={data}", "--user=root", "--skip-test-db",
                  "--auth-root-authentication-method=normal"], c, "mariadb-install-db")
        out = open(r / "log" / "mariadb.log", "ab")
        subprocess.Popen(["mariadbd", "--no-defaults", f"--datadir={data}", "--user=root", f"--port={PORTS['mariadb']}",
                          "--bind-address=127.0.0.1", f"--socket={r / 'db' / 'mysqld.sock'}",
                          f"--pid-file={c.pid_file('mariadb')}", "--skip-grant-tables", "--innodb-buffer-pool-size=64M"],
                         stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
        _wait("mariadb", lambda: _port_open(PORTS["mariadb"]), 60, r / "log")
    elif daemon == "munged":
        _run(["munged", "--force", f"--key-file={r / 'etc' / 'munge.key'}", f"--socket={c.munge_socket}",
              f"--pid-file={c.pid_file('munged')}", f"--log-file={r / 'log' / 'munged.log'}",
              f"--seed-file={r / 'munge' / 'munged.seed'}"], c, "munged")
    elif daemon == "slurmdbd":
        _run(["slurmdbd"], c, "slurmdbd", {"SLURMDBD_CONF": str(r / "etc" / "slurmdbd.conf")})
        _wait("slurmdbd", lambda: _port_open(PORTS["slurmdbd"]), 60, r / "log")
    elif daemon == "slurmctld":
        _run(["slurmctld", "-f", str(c.conf)], c, "slurmctld")
        _wait("slurmctld", lambda: _port_open(PORTS["slurmctld"]), 60, r / "log")
    elif daemon.startswith("slurmd-"):
        node = daemon.removeprefix("slurmd-")
        (r / "spool" / node).mkdir(parents=True, exist_ok=True)
        c.node_local(node).mkdir(parents=True, exist_ok=True)
        _run(["slurmd", "-f", str(c.conf), "-N", node], c, f"slurmd -N {node}")
    _wait(f"{daemon} pid file", lambda: _alive(c, daemon) is not None, 30, c.root / "log")


def node_states(c: Cluster) -> dict[str, str]:
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=c.env(), capture_output=True, text=True,
                          check=False)
    pairs = [line.split() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []
    return {p[0]: p[1] for p in pairs if len(p) == 2}


def resume_node(c: Cluster) -> None:
    """Nodes left down or drained (a fault test) back to service."""
    for node, state in node_states(c).items():
        if state.rstrip("*~#") in ("down", "drained", "draining", "drain", "fail"):
            _run(["scontrol", "update", f"nodename={node}", "state=resume"], c, "scontrol update state=resume")


FUSECTL = Path("/sys/fs/fuse/connections")


def mount_fusectl(mounts: Path = Path("/proc/mounts")) -> None:
    """fusectl at /sys/fs/fuse/connections, as a site's node set-up mounts it (root only: never in a user namespace):
    a gate task whose .sqsh mount lost its FUSE server aborts its own connection there, so that no process of it stays
    in D state (builder/runners/slurm_runtimes.py). Without it the task cannot: one line says so, the cluster still starts."""
    if any(line.split()[2:3] == ["fusectl"] for line in mounts.read_text().splitlines()):
        return
    proc = subprocess.run(["mount", "-t", "fusectl", "fusectl", str(FUSECTL)], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        log.info(fit(f"local cluster: fusectl not mounted at {FUSECTL} ({proc.stderr.strip() or proc.returncode}): "
                     "a gate whose FUSE server is killed can leave a process in D state"))


def start(root: Path | None = None, settings: Settings | None = None) -> Cluster:
    """Install what is missing, mount fusectl, configure and start every daemon, then wait until the node is idle."""
    settings = settings or Settings.from_env()
    ensure_installed(settings)
    mount_fusectl()
    c = Cluster((root or default_root(settings)).absolute())
    configure(c)
    for daemon in DAEMONS:
        start_daemon(c, daemon)
    def ready() -> bool:
        resume_node(c)
        states = node_states(c)
        return set(states) == set(NODES) and all(s.rstrip("*~#") in ("idle", "mixed", "allocated")
                                                 for s in states.values())

    _wait("node idle", ready, 90, c.root / "log", every=1.0)
    return c


def stop(root: Path | None = None) -> None:
    """Stop the daemons (TERM, then KILL after 15 s), in reverse start order."""
    c = Cluster((root or default_root()).absolute())
    for daemon in reversed(DAEMONS):
        pid = _alive(c, daemon)
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(c, daemon):
            time.sleep(0.1)
        if _alive(c, daemon):
            os.kill(pid, signal.SIGKILL)
        c.pid_file(daemon).unlink(missing_ok=True)


def status(root: Path | None = None) -> dict[str, int | None]:
    c = Cluster((root or default_root()).absolute())
    return {daemon: _alive(c, daemon) for daemon in DAEMONS}


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    root = Path(argv[1]) if len(argv) > 1 else None
    if command == "start":
        try:
            c = start(root)
        except BuilderError as err:  # a missing piece or a daemon that does not start: one line, no traceback
            print(fit(f"error: {err}"), file=sys.stderr)
            return err.exit_code
        print(f"SLURM_CONF={c.conf}")
    elif command == "stop":
        stop(root)
    elif command == "status":
        for daemon, pid in status(root).items():
            print(f"{daemon:<10} {pid or 'not running'}")
    else:
        print(f"error: expected start, stop or status, got {command[:40]!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
