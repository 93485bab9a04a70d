"""`builder nightly A.yaml B.yaml ... --jobs N`: one nightly per pins file, at most N at a time, each in its
own `builder nightly` process (its own run ID, so its own local tags; its log in a file). With --slurm every
run starts at once (unless --jobs says otherwise): each builds here and submits its gates to Slurm, and the
cluster runs them as far as its resources allow; the fleet only waits for the processes. The runs share the
engine, the registry, the mirrors, the wheelhouse, the export cache and the history, which are safe under
concurrent writers (file locks, atomic renames, SQLite in WAL mode).

The fleet's exit code is the most severe of the runs' (builder/core/errors.py `SEVERITY`): 130 interrupted,
3 infrastructure, 2 bad input, 1 not accepted, 4 regression, 0 all accepted.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import files as fs
from builder.core import log, options
from builder.core.errors import BadInput, Interrupted
from builder.core.errors import severest as severest  # the fleet's exit code
from builder.core.options import Settings

MAX_JOBS = 64


@dataclass(frozen=True)
class Job:
    pins: Path
    out: Path | None
    log: Path
    run_id: str


@dataclass(frozen=True)
class Outcome:
    job: Job
    code: int
    seconds: float
    last_line: str


def slurm_argv(flags: dict[str, Any] | None) -> list[str]:
    """The --slurm flags again, for each run's own `builder nightly` process (None: no --slurm)."""
    if flags is None:
        return []
    names = {"time_limit_s": "time-limit", "shared_dir": "shared-dir"}
    return ["--slurm", *[w for k, v in flags.items() if v is not None
                         for w in (f"--slurm-{names.get(k, k)}", str(v))]]


def plan(pins_paths: list[Path], out: Path | None, settings: Settings) -> list[Job]:
    """One job per pins file: its run directory under `out` (`<n>-<stem>`), its log and run ID."""
    if len(set(p.resolve() for p in pins_paths)) != len(pins_paths):
        raise BadInput("PINS: expected each pins file once (a run rewrites its pins file with --follow-prs)")
    logs = settings.cache("logs", "nightly", settings.run_id)
    base_id = settings.run_id[:26].rstrip("-")
    return [Job(pins=p, out=(out / f"{i}-{p.stem}") if out else None, log=logs / f"{i}-{p.stem}.log",
                run_id=f"{base_id}-n{i}") for i, p in enumerate(pins_paths, 1)]


def run_fleet(jobs: list[Job], parallel: int, flags: list[str]) -> list[Outcome]:
    """Run the jobs, `parallel` at a time; on an interruption every child gets SIGTERM and is waited for."""
    if not 1 <= parallel <= MAX_JOBS:
        raise BadInput(f"--jobs: expected 1..{MAX_JOBS}, got {parallel}")
    children: dict[Job, subprocess.Popen[bytes]] = {}
    lock = threading.Lock()
    stopping = threading.Event()

    def one(job: Job) -> Outcome:
        start = time.monotonic()
        argv = [sys.executable, "-m", "builder", "nightly", str(job.pins), *flags,
                *(["--out", str(job.out)] if job.out else [])]
        env = options.child_environment(BUILDER_RUN_ID=job.run_id)
        with lock:
            if stopping.is_set():
                return Outcome(job, Interrupted.exit_code, 0.0, "not started: interrupted")
            with open(job.log, "wb") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
            children[job] = proc
        log.info(f"nightly {job.pins}: started (run {job.run_id}, log {job.log})")
        code = proc.wait()
        lines = fs.tail(job.log, 1)
        outcome = Outcome(job, Interrupted.exit_code if code < 0 else code, round(time.monotonic() - start, 1),
                          lines[0] if lines else "")
        log.info(f"nightly {job.pins}: exit {outcome.code} in {outcome.seconds} s: {outcome.last_line[:200]}")
        return outcome

    pool = ThreadPoolExecutor(max_workers=parallel)
    futures = [pool.submit(one, job) for job in jobs]
    try:
        return [f.result() for f in futures]
    except (KeyboardInterrupt, Interrupted):
        stopping.set()
        with lock:
            for proc in children.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        for proc in children.values():
            proc.wait()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
