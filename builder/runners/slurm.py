"""The Slurm client commands, as a user runs them: `salloc --no-shell` for one allocation per acceptance,
`srun --jobid` for each step, `sacct` for Slurm's own record of every step, `scancel` by job ID. No SSH,
no REST. The site's `SLURM_CONF` (or /etc/slurm/slurm.conf) says which cluster; a client that cannot
reach slurmctld or munged is InfraError (exit 3).

Sites throttle clients that poll (slurmctld's RPC rate limit, sacct's load on slurmdbd): the builder waits on srun
itself and polls only with `pauses()`, never more often than once a second; CALLS counts every client command."""
from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from builder.core.errors import InfraError

FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "Partition", "Cluster", "Elapsed")
FINAL = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE")


CALLS: Counter[str] = Counter()  # client commands run, by name (benchmarks/bench_cluster.py: per gate)


def pauses(first: float = 1.0, most: float = 5.0) -> Iterator[float]:
    """The pauses between two polls of a Slurm client: from `first` (never under 1 s), half again each time, up to
    `most`."""
    pause = max(1.0, first)
    while True:
        yield pause
        pause = min(max(most, 1.0), pause * 1.5)


def with_user(argv: list[str]) -> list[str]:
    """The command under `env USER=<this uid's name>`: the caller's environment (SLURM_CONF, ...) is
    inherited, and ch-run, which srun starts with it, refuses to start without USER."""
    return ["env", f"USER={pwd.getpwuid(os.getuid()).pw_name}", *argv]


def tool(name: str) -> str:
    """The client command's path (counted in CALLS: each lookup starts one)."""
    CALLS[name] += 1
    path = shutil.which(name)
    if not path:
        raise InfraError(f"{name}: not found; --slurm needs the Slurm client commands (apt-get install slurm-client)")
    return path


def call(argv: list[str], what: str, timeout: float = 60) -> str:
    """Run a client command; its one-line complaint as InfraError when it fails."""
    try:
        proc = subprocess.run(with_user([tool(argv[0]), *argv[1:]]), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise InfraError(f"slurm: {what}: no answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise InfraError(f"slurm: {what}: {complaint(proc.stderr or proc.stdout)}")
    return proc.stdout


def complaint(text: str) -> str:
    """The line that says why (munge or controller first), shortened."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for needle in ("munge", "Munge", "Unable to contact slurm controller", "Unable to allocate", "error",
                   "unrecognized", "invalid"):
        for line in lines:
            if needle in line:
                return line[-240:]
    return (lines[-1] if lines else "no output")[-240:]


def allocate(argv: list[str], on_job: Any, timeout: float) -> str:
    """`salloc --no-shell ARGV`: the job ID, handed to `on_job` as soon as Slurm names it (pending or
    granted), so an interrupt while it waits in the queue cancels exactly it."""
    proc = subprocess.Popen(with_user([tool("salloc"), "--no-shell", *argv]), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job, lines = None, []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            found = re.search(r"(?:Pending|Granted) job allocation (\d+)", line)
            if found and job is None:
                job = found.group(1)
                on_job(job)
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0 or job is None:
        raise InfraError(f"slurm: salloc: {complaint(''.join(lines))}")
    return job


def start_step(argv: list[str], stdout: IO[bytes] | int, stderr: IO[bytes] | int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(with_user([tool("srun"), *argv]), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)


def records(job: str) -> list[dict[str, str]]:
    """Slurm's accounting record of the job and its steps (sacct)."""
    out = call(["sacct", "-j", job, "-n", "-P", "--noconvert", "-o", ",".join(FIELDS)], f"sacct -j {job}")
    return [dict(zip(FIELDS, line.split("|"))) for line in out.splitlines() if line.strip()]


def step_record(job: str, name: str, wait_s: float = 10) -> dict[str, str]:
    """The step named `name` once its state is final (accounting lags the step by a moment), with the job's own
    state from the same sacct call as JobState: a step Slurm killed when it ended the job (scancel, the allocation's
    time limit) may be recorded COMPLETED 0:0, while the job's record says CANCELLED or TIMEOUT (slurmctld logs
    the job's end before it kills the steps, so the job's row is never behind a killed step's)."""
    deadline = time.monotonic() + wait_s
    for pause in pauses():
        rows = records(job)
        steps = [r for r in rows if r["JobName"] == name and "." in r["JobID"]]
        if steps and steps[-1]["State"].split()[0] in FINAL or time.monotonic() > deadline:
            mine = [r["State"] for r in rows if r["JobID"] == job]
            return {**steps[-1], **({"JobState": mine[0]} if mine else {})} if steps else {}
        time.sleep(pause)
    raise AssertionError("pauses() never ends")


def job_state(job: str) -> dict[str, str]:
    """`scontrol show job -o`: the allocation's live state and reason (or {} once Slurm forgot it)."""
    proc = subprocess.run([tool("scontrol"), "show", "job", "-o", job], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=False, timeout=30)
    if proc.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))


def node_states(nodes: list[str]) -> dict[str, str]:
    """`sinfo -n NODES`, one call: each node's state ("idle", "mixed", "down*", "drained", ...); a node Slurm did
    not list is missing."""
    if not nodes:
        return {}
    proc = subprocess.run([tool("sinfo"), "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, check=False, timeout=30)
    rows = [line.split() for line in proc.stdout.splitlines()] if proc.returncode == 0 else []
    return {row[0]: row[1] for row in rows if len(row) == 2}


def down_since(nodes: list[str], since: str) -> list[str]:
    """Nodes Slurm recorded as DOWN since `since` (slurmdbd's node events, `sacctmgr show event`): a node set down
    mid-gate may be back already (ReturnToService), its event stays. A drain is no event of failure."""
    if not nodes or not since:
        return []
    proc = subprocess.run(with_user([tool("sacctmgr"), "-n", "-P", "show", "event", f"nodes={','.join(nodes)}",
                                     f"start={since}", "format=NodeName,Start,State"]), capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, check=False, timeout=30)
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.count("|") == 2] if proc.returncode == 0 else []
    return sorted({r[0] for r in rows if r[1] >= since and r[2].upper().startswith(("DOWN", "FAIL"))})


def cancel(job: str) -> None:
    """`scancel JOB` (exactly this job ID); quiet when it is gone already."""
    subprocess.run([tool("scancel"), "--quiet", job], capture_output=True, stdin=subprocess.DEVNULL,
                   check=False, timeout=60)


def cluster_name() -> str:
    out = call(["scontrol", "show", "config"], "scontrol show config")
    found = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.M)
    return found.group(1) if found else "unknown"


def minutes(seconds: int) -> str:
    """A time limit for --time: whole minutes, at least one (Slurm's granularity)."""
    return str(max(1, -(-seconds // 60)))


def tail(path: Path, size: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - size))
        return handle.read().decode("utf-8", "replace")
