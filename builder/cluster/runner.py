"""GateRunner on Slurm: one allocation per acceptance (`salloc --no-shell`), one step per gate
(`srun --jobid`), each step a fresh container of the read-only .sqsh through the runtime
(builder/cluster/runtimes.py). Before the first gate, a step on the node hashes the .sqsh it is about to
mount; a sha256 other than the recorded one fails every gate with that reason. Each gate's facts are
Slurm's own record (sacct): cluster, partition, job and step, node, state, exit code; plus the node's
GPUs, the node-side sha256 and the runtime. A step over the gate's time limit is cancelled (fail, naming
the limit); a node failure or someone else's scancel makes the gate inconclusive; close() cancels exactly
this runner's job."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.accept import runner as gate_runner
from builder.cluster import runtimes, slurm
from builder.core import log
from builder.core.constants import CACHE_DIR, CACHE_ENV
from builder.core.errors import BadInput
from builder.core.records import GateResult
from builder.pins.model import Pins

SCRATCH_CACHE = "/tmp/cache"   # the compile caches inside the container's private /tmp (fresh per gate)
MARGIN_S = 300                 # allocation time beyond the sum of the gates' limits
# OpenSSL's sha256 uses the CPU's SHA instructions (3.4x coreutils' sha256sum here: 1.5 s against 5.0 s for 1 GB);
# sha256sum where a node has no openssl.
CHECK = r"""n=$(hostname -s); s=$(date +%s.%N)
if command -v openssl >/dev/null; then t=openssl; h=$(openssl dgst -sha256 -r "$1" | cut -c1-64)
else t=sha256sum; h=$(sha256sum "$1" | cut -c1-64); fi; e=$(date +%s.%N)
echo "$n sha256=$h"; echo "$n seconds=$(awk "BEGIN{print $e - $s}")"; echo "$n size=$(stat -c %s "$1")"; echo "$n hasher=$t"
echo "$n version=$(VERSION | head -n1)"
q="--query-gpu=name,driver_version,memory.total --format=csv,noheader"
echo "$n gpus=$( (nvidia-smi $q 2>/dev/null || echo none) | tr '\n' ';' | sed 's/;$//')"
if [ "$h" = "$2" ]; then ENV && echo "$n env=$3/environment-$n"; fi
"""


@dataclass
class SlurmOptions:
    """Where and how: from acceptance.slurm in the pins, overridden by CLI flags."""

    shared_dir: Path
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit_s: int | None = None     # per gate; default acceptance.timeout_s
    srun_args: list[str] = field(default_factory=list)
    runtime: str = "charliecloud"
    gpus: int = 0

    def allocation_args(self) -> list[str]:
        args = [f"--partition={self.partition}"] if self.partition else []
        args += [f"--account={self.account}"] if self.account else []
        args += [f"--qos={self.qos}"] if self.qos else []
        return args + ([f"--gpus-per-node={self.gpus}"] if self.gpus else [])


class SlurmRunner:
    kind = "slurm"

    def __init__(self, pins: Pins, sqsh: Path, sha256: str, options: SlurmOptions, gate_runs: int,
                 run_id: str | None = None):
        if pins.acceptance.mounts:
            raise BadInput("acceptance.mounts: expected none under --slurm (ch-run binds read-write; the gates'"
                           " read-only mounts need the Docker runner)")
        self.pins, self.sqsh, self.sha256, self.options = pins, sqsh, sha256, options
        self.runtime = runtimes.get(options.runtime)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.work = options.shared_dir / ".runs" / self.run_id
        self.limit_s = options.time_limit_s or pins.acceptance.timeout_s
        self.alloc_s = self.limit_s * max(gate_runs, 1) + MARGIN_S
        self.job: str | None = None
        self.ended: str | None = None      # why the allocation is gone, once it is
        self.node: dict[str, Any] = {}
        self.cluster = "unknown"
        self.steps = 0
        self.live: subprocess.Popen[bytes] | None = None
        self.live_step: str | None = None
        self.cancelled_by_us: set[str] = set()

    # ---- the allocation and the one-time check -------------------------------------------------

    def _remember(self, job: str) -> None:
        self.job = job

    def _allocate(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.cluster = slurm.cluster_name()
        argv = ["-N1", f"--job-name=builder-accept-{self.run_id}", f"--time={slurm.minutes(self.alloc_s)}",
                *self.options.allocation_args()]
        with log.step("slurm: allocation"):
            slurm.allocate(argv, self._remember, timeout=float(self.alloc_s))
        with log.step("slurm: .sqsh sha256 on the node"):
            self._check()

    def _check(self) -> None:
        assert self.job is not None
        env_cmd = self.runtime.env_command(str(self.sqsh), f"{self.work}/environment-$n") or "true"
        script = CHECK.replace("VERSION", self.runtime.version_command()).replace("ENV", env_cmd)
        out, err = self.work / "check.out", self.work / "check.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = slurm.start_step([f"--jobid={self.job}", "-N1", "--ntasks-per-node=1", "--job-name=sqsh-check",
                                     f"--time={slurm.minutes(self.limit_s)}", "/bin/sh", "-c", script, "check",
                                     str(self.sqsh), self.sha256, str(self.work)], o, e)
            self.live, self.live_step = proc, "sqsh-check"
            rc = proc.wait()
            self.live = None
        facts: dict[str, Any] = {}
        for line in out.read_text().splitlines():
            node, _, pair = line.partition(" ")
            key, _, value = pair.partition("=")
            facts["node"] = node
            facts[key] = value
        record = slurm.step_record(self.job, "sqsh-check")
        seconds = float(facts.get("seconds") or 0)
        size = int(facts.get("size") or 0)
        self.node = {"name": facts.get("node"), "sqsh_sha256": facts.get("sha256"), "runtime_version":
                     facts.get("version"), "gpus": facts.get("gpus"), "environment": facts.get("env"),
                     "check": {"seconds": seconds, "bytes": size, "mb_per_s": round(size / 1e6 / seconds, 1)
                               if seconds else None, "hasher": facts.get("hasher"), "step": record.get("JobID"),
                               "state": record.get("State"), "exit_code": record.get("ExitCode")}}
        if rc != 0 or not facts.get("sha256"):
            self.ended = f"the .sqsh check step on the node failed (exit {rc}): {slurm.complaint(err.read_text())}"
        elif facts["sha256"] != self.sha256:
            self.ended = (f".sqsh sha256 on node {facts.get('node')} is {facts['sha256'][:16]}..., "
                          f"recorded {self.sha256[:16]}... ({self.sqsh})")
        elif self.runtime.env_command("x", "y") and not facts.get("env"):
            self.ended = f"could not read the image's /etc/environment on node {facts.get('node')}"

    # ---- one gate ----------------------------------------------------------------------------

    def run(self, gate: str, settings: dict[str, Any], timeout_s: int) -> tuple[GateResult, dict[str, Any]]:
        if self.job is None and self.ended is None:
            self._allocate()
        if self.ended is not None:
            return GateResult(name=gate, status="fail" if "sha256" in self.ended else "inconclusive",
                              reason=self.ended), {"job_id": self.job, **self._where()}
        assert self.job is not None
        self.steps += 1
        name = f"{gate}-{self.steps}"
        out_dir = self.work / name
        out_dir.mkdir()
        settings = {**settings, "cache_dir": SCRATCH_CACHE}
        env = {k: v.replace(CACHE_DIR, SCRATCH_CACHE, 1) for k, v in CACHE_ENV.items()}
        spec = runtimes.GateSpec(sqsh=str(self.sqsh), out_dir=str(out_dir), env_file=str(self.node.get("environment")),
                                 env=env, command=gate_runner.gate_command(self.pins, gate, settings))
        argv = [f"--jobid={self.job}", "-N1", "-n1", f"--job-name={name}", f"--time={slurm.minutes(timeout_s)}",
                "--kill-on-bad-exit=1", *self.runtime.srun_args(spec), *self.options.srun_args, *self.runtime.argv(spec)]
        stdout, stderr = self.work / f"{name}.out", self.work / f"{name}.err"
        timed_out = False
        start = time.monotonic()
        with open(stdout, "wb") as o, open(stderr, "wb") as e:
            proc = slurm.start_step(argv, o, e)
            self.live, self.live_step = proc, name
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._cancel_step(name)
                rc = proc.wait()
            finally:
                self.live = None
        seconds = round(time.monotonic() - start, 3)
        record = slurm.step_record(self.job, name)
        out_text, err_text = stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
        facts = {**self._where(), "job_id": self.job, "step": record.get("JobID"), "step_name": name,
                 "state": record.get("State"), "exit_code": record.get("ExitCode"), "srun_exit": rc,
                 "node": record.get("NodeList") or self.node.get("name"), "seconds": seconds,
                 "argv": ["srun", *argv[:-len(spec.command)]] + spec.command[:4]}
        shutil.rmtree(out_dir, ignore_errors=True)
        state = (record.get("State") or "").split(" ")[0]
        job = slurm.job_state(self.job)
        if state == "NODE_FAIL" or job.get("JobState") == "NODE_FAIL" or _node_down(job):
            self.ended = f"node failure: allocation {self.job} on {facts['node']} ended ({job.get('JobState') or state})"
            return GateResult(name=gate, status="inconclusive", reason=f"node failure (Slurm: step {record.get('JobID')} "
                              f"{record.get('State')}, job {job.get('JobState')}, node {facts['node']})",
                              log=(err_text + out_text)[-6000:]), facts
        if timed_out or state == "TIMEOUT":
            return GateResult(name=gate, status="fail", reason=f"timed out: over the gate's time limit of {timeout_s} s "
                              f"(step {record.get('JobID')} {'cancelled by the builder' if timed_out else 'TIMEOUT'})",
                              evidence={"timeout_s": timeout_s}, log=(err_text + out_text)[-6000:]), facts
        if (state == "CANCELLED" or job.get("JobState") == "CANCELLED") and name not in self.cancelled_by_us:
            whole = job.get("JobState") == "CANCELLED"
            if whole:
                self.ended = f"allocation {self.job} was cancelled outside the builder (scancel)"
            facts["job_state"] = job.get("JobState")
            return GateResult(name=gate, status="inconclusive", reason=f"cancelled outside the builder (scancel): "
                              f"{'job ' + self.job if whole else 'step ' + str(record.get('JobID'))} CANCELLED; step "
                              f"{record.get('JobID')} {record.get('State')}", log=(err_text + out_text)[-6000:]), facts
        code = _exit_code(record.get("ExitCode"), rc)
        return gate_runner.result_from_output(gate, code, out_text, err_text, False, timeout_s), facts

    def _where(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "partition": self.options.partition or _partition(self.job),
                "node": self.node.get("name"), "gpus": self.node.get("gpus"), "sqsh": str(self.sqsh),
                "sqsh_sha256_node": self.node.get("sqsh_sha256"), "runtime": self.runtime.name,
                "runtime_version": self.node.get("runtime_version")}

    def _cancel_step(self, name: str) -> None:
        self.cancelled_by_us.add(name)
        step = next((r["JobID"] for r in slurm.records(self.job or "") if r["JobName"] == name), None)
        if step:
            slurm.cancel(step)
        elif self.live is not None:
            self.live.terminate()

    # ---- the report and the end --------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        version = self.node.get("runtime_version")
        return {"runner": self.kind, "engine": f"Slurm cluster {self.cluster}, {self.runtime.name} {version}",
                "runtime": self.runtime.name, "runtime_version": version,
                "isolation": self.runtime.isolation(), "cluster": self.cluster, "job_id": self.job,
                "partition": self.options.partition or _partition(self.job), "node": self.node.get("name"),
                "node_gpus": self.node.get("gpus"), "sqsh": str(self.sqsh), "sqsh_sha256": self.sha256,
                "sqsh_sha256_node": self.node.get("sqsh_sha256"), "sqsh_check": self.node.get("check"),
                "time_limit_s": self.limit_s, "allocation_limit_min": slurm.minutes(self.alloc_s),
                "srun_args": list(self.options.srun_args), "network": self.runtime.isolation()["network"]}

    def close(self) -> None:
        """Cancel this runner's job (exactly its ID) and wait until Slurm no longer lists it."""
        if self.live is not None and self.live.poll() is None:
            self.live.terminate()
        if self.job is not None:
            slurm.cancel(self.job)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and slurm.job_state(self.job).get("JobState") in (
                    "RUNNING", "PENDING", "COMPLETING", "CONFIGURING", "SUSPENDED"):
                time.sleep(0.2)
        if self.live is not None:
            try:
                self.live.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.live.kill()
        shutil.rmtree(self.work, ignore_errors=True)


def _exit_code(text: str | None, rc: int) -> int:
    """sacct's ExitCode is 'code:signal'."""
    try:
        code, _, sig = (text or "").partition(":")
        return int(code) if int(code) or not int(sig or 0) else 128 + int(sig)
    except ValueError:
        return rc


def _node_down(job: dict[str, str]) -> bool:
    return "NodeDown" in job.get("Reason", "") or "node_fail" in job.get("Reason", "").lower()


def _partition(job: str | None) -> str | None:
    return slurm.job_state(job).get("Partition") if job else None


def dumps(data: Any) -> str:
    return json.dumps(data, sort_keys=True)
