"""GateRunner on Slurm: one allocation per acceptance (`salloc --no-shell -N<nodes>`), one step per gate
(`srun --jobid`, one task per node of the recipe's layout), each task a fresh container of the read-only .sqsh
through the runtime (builder/runners/slurm_runtimes.py).

Before the first gate a check step runs on every node of the allocation (builder/runners/nodecheck.py): it hashes
the .sqsh that node will mount (its node-local copy, filled under a per-node lock, when the site stages images)
and reads the image's environment; a node whose sha256 is not the recorded one fails every gate naming the node.
Each gate's facts are Slurm's own record (sacct) of its step, per node. Limits come from the plan: the step's
`--time` and the builder's cancel are the gate's limit, the allocation is the plan's. A node failure, the
allocation running out or someone else's scancel makes the gate inconclusive; close() cancels exactly this job."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from builder.core import log
from builder.core.constants import CACHE_DIR, CACHE_ENV
from builder.core.evidence import Census, Rank
from builder.core.records import Evidence, GateResult, SlurmFacts, SqshFacts
from builder.gating import runner as gate_runner
from builder.gating.plan import AcceptancePlan, SlurmPlace
from builder.gating.settings import Call, Layout, Placement
from builder.pins.model import Pins
from builder.runners import nodecheck, slurm
from builder.runners import slurm_runtimes as runtimes

SCRATCH_CACHE = runtimes.CACHE  # the compile caches inside the container's private /tmp (fresh per gate)
RANK_LOG_MAX = 256 * 1024  # characters of each rank's log kept with the run (its end: where a failure shows)


class SlurmRunner:
    kind = "slurm"

    def __init__(self, pins: Pins, plan: AcceptancePlan, sqsh: SqshFacts, run_id: str | None = None):
        assert isinstance(plan.place, SlurmPlace)
        self.pins, self.plan, self.place, self.sqsh = pins, plan, plan.place, sqsh
        self.runtime = runtimes.get(self.place.runtime)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.work = self.place.shared_dir / ".runs" / self.run_id
        self.job: str | None = None
        self.ended: str | None = None      # why the allocation is gone (or unusable), once it is
        self.failed = False                # `ended` is a failure of the image (a node's sha256), not of the cluster
        self.nodes: list[nodecheck.Node] = []
        self.cluster = "unknown"
        self.steps = 0
        self.live: subprocess.Popen[bytes] | None = None
        self.cancelled_by_us: set[str] = set()

    # ---- the allocation and the one-time check on every node ------------------------------------

    def _remember(self, job: str) -> None:
        self.job = job

    def _allocate(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.cluster = slurm.cluster_name()
        argv = [f"-N{self.place.nodes}", f"--job-name=builder-accept-{self.run_id}",
                f"--time={slurm.minutes(self.place.allocation_s)}", *self.place.allocation_args()]
        with log.step(f"slurm: allocation ({self.place.nodes} node(s), {slurm.minutes(self.place.allocation_s)} min)"):
            slurm.allocate(argv, self._remember, timeout=float(self.place.allocation_s))
        with log.step("slurm: .sqsh sha256 on every node"):
            self._check()

    def _check(self) -> None:
        assert self.job is not None
        targets = [m.target for m in self.pins.acceptance.mounts] + [s[1] for s in [self._scratch()] if s]
        script = nodecheck.script(self.runtime, targets)
        argv = [f"--jobid={self.job}", f"-N{self.place.nodes}", "--ntasks-per-node=1", "--job-name=sqsh-check",
                f"--time={slurm.minutes(self.place.check_s)}", f"--output={self.work}/check-%t.out",
                f"--error={self.work}/check-%t.err", "/bin/sh", "-c", script, "check", self.sqsh.path,
                self.sqsh.sha256, str(self.work), self.place.node_local_dir or ""]
        proc = slurm.start_step(argv, subprocess.DEVNULL, subprocess.DEVNULL)
        self.live = proc
        try:
            rc = proc.wait(timeout=self.place.check_s + 30)
        except subprocess.TimeoutExpired:
            slurm.cancel(self.job)
            rc = proc.wait()
        self.live = None
        record = slurm.step_record(self.job, "sqsh-check")
        self.nodes = [nodecheck.parse(p.read_text(errors="replace"), record)
                      for p in sorted(self.work.glob("check-*.out"))]
        complaint = " ".join(slurm.complaint(p.read_text(errors="replace")) for p in self.work.glob("check-*.err")
                             if p.stat().st_size)
        self.ended, self.failed = nodecheck.verdict(self.nodes, self.sqsh.sha256, self.place.nodes, rc, complaint,
                                                    self.runtime.env_command("x", "y") is not None)

    # ---- one gate ----------------------------------------------------------------------------

    def run(self, call: Call, timeout_s: int) -> tuple[GateResult, dict[str, Any]]:
        gate = call.gate
        if self.job is None and self.ended is None:
            self._allocate()
        if self.ended is not None:
            return GateResult(name=gate, status="fail" if self.failed else "inconclusive",
                              reason=self.ended), {"job_id": self.job}
        assert self.job is not None
        self.steps += 1
        name = f"{gate}-{self.steps}"
        out_dir = self.work / name
        out_dir.mkdir()
        text = json.dumps(call.wire(self._placement()))
        for rank in range(self.place.nodes):  # every rank reads the same settings from its own output directory
            (out_dir / str(rank)).mkdir()
            (out_dir / str(rank) / "settings.json").write_text(text)
        argv, spec = self.step_argv(gate, name, str(out_dir), timeout_s)
        n = self.place.nodes
        timed_out = False
        start = time.monotonic()
        proc = slurm.start_step(argv, subprocess.DEVNULL, subprocess.DEVNULL)
        self.live = proc
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
        outs = [_text(self.work / f"{name}-{t}.out") for t in range(n)]
        errs = [_text(self.work / f"{name}-{t}.err") for t in range(n)]
        facts = {"job_id": self.job, "step": record.get("JobID"), "step_name": name, "state": record.get("State"),
                 "exit_code": record.get("ExitCode"), "srun_exit": rc, "node": record.get("NodeList"),
                 "seconds": seconds, "argv": ["srun", *argv[:-len(spec.command)]] + spec.command[:4],
                 "nodes": [x.name for x in self.nodes]}
        shutil.rmtree(out_dir, ignore_errors=True)
        logs = self._rank_logs(outs, errs)
        log_tail = (errs[0] + outs[0])[-gate_runner.TAIL:]
        ended = self._ended(record, name, timed_out, timeout_s, log_tail, facts)
        if ended is not None:
            return _with_logs(ended, logs), facts
        gone = _fuse_gone(errs)
        if gone:  # the task ended its own FUSE connection: the node's mount failed, not the image
            return _with_logs(GateResult(name=gate, status="inconclusive", reason=gone, log=log_tail), logs), facts
        code = _exit_code(record.get("ExitCode"), rc)
        result = gate_runner.result_from_output(gate, code, outs[0], errs[0], False, timeout_s)
        return _with_logs(_merge_roles(result, [gate_runner.last_json(o) for o in outs[1:]], self.nodes), logs), facts

    def _rank_logs(self, outs: list[str], errs: list[str]) -> dict[str, str]:
        """Every rank's log (its stderr, then its stdout; the last RANK_LOG_MAX characters), by "rank<N> <node>":
        the rollout server's lines on n2 are kept with the run, not only rank 0's."""
        names = [x.name for x in self.nodes]
        return {f"rank{t} {names[t] if t < len(names) else '?'}": (errs[t] + outs[t])[-RANK_LOG_MAX:]
                for t in range(len(outs))}

    def step_argv(self, gate: str, name: str, out_dir: str, timeout_s: int) -> tuple[list[str], runtimes.GateSpec]:
        """srun's arguments for one gate step (after `srun`) and its task's spec, from the job, the plan, the pins
        and the runtime only: nothing runs (tests/unit/test_cluster_unit.py builds the pyxis line with it)."""
        env = {k: v.replace(CACHE_DIR, SCRATCH_CACHE, 1) for k, v in CACHE_ENV.items()}
        spec = runtimes.GateSpec(sqsh=self._sqsh_on_node(), out_dir=out_dir + "/$SLURM_PROCID",
                                 env_file=f"{self.work}/environment-$SLURMD_NODENAME", env=env,
                                 command=gate_runner.gate_command(self.pins, gate, f"@{runtimes.WORK}/settings.json"),
                                 mounts=tuple((m.source, m.target) for m in self.pins.acceptance.mounts),
                                 scratch=self._scratch(), pass_env=self._pass_env(), cache=self._jit_dir())
        n = self.place.nodes
        argv = [f"--jobid={self.job}", f"-N{n}", f"-n{n}", "--ntasks-per-node=1", f"--job-name={name}",
                f"--time={slurm.minutes(timeout_s)}", "--kill-on-bad-exit=1", f"--output={self.work}/{name}-%t.out",
                f"--error={self.work}/{name}-%t.err", *(["--resv-ports=1"] if n > 1 else []),
                *self.runtime.srun_args(spec), *self.place.srun_args, *self.runtime.argv(spec)]
        return argv, spec

    def _ended(self, record: dict[str, str], name: str, timed_out: bool, timeout_s: int, log_tail: str,
               facts: dict[str, Any]) -> GateResult | None:
        """The gate's end when Slurm or the builder ended its step, else None."""
        gate = name.rsplit("-", 1)[0]
        state = (record.get("State") or "").split(" ")[0]
        recorded = (record.get("JobState") or "").split(" ")[0]  # the job's own sacct row, read with the step's
        if state == "COMPLETED" and not timed_out and recorded == "RUNNING":  # ran to its end (no more calls)
            return None
        job = slurm.job_state(self.job or "")  # a step COMPLETED under an ended job was killed with it: ask why
        if not job.get("JobState") and recorded:  # Slurm forgot the job (MinJobAge): its accounting record
            job["JobState"] = recorded
        facts["job_state"] = job.get("JobState")
        names = [x.name for x in self.nodes]
        failed = state == "NODE_FAIL" or job.get("JobState") == "NODE_FAIL" or _node_down(job)
        down: list[str] = []
        deadline = time.monotonic() + (10 if failed else 0)
        for pause in slurm.pauses():  # slurmdbd records the node's event a moment after the job saw it
            down = sorted(set(_down_nodes(names)) | set(slurm.down_since(names, job.get("StartTime", ""))))
            if down or time.monotonic() >= deadline:
                break
            time.sleep(pause)
        if failed or down:
            self.ended = f"node failure: allocation {self.job} lost node(s) {', '.join(down) or facts['node']}"
            return GateResult(name=gate, status="inconclusive", reason=f"node failure: node(s) "
                              f"{', '.join(down) or facts['node']} down (Slurm: step {record.get('JobID')} "
                              f"{record.get('State')}, job {job.get('JobState')})", log=log_tail)
        if job.get("JobState") == "TIMEOUT" or "DUE TO TIME LIMIT" in (record.get("State") or "") and not timed_out \
                and job.get("JobState") != "RUNNING":
            self.ended = f"the allocation {self.job} ran out of time ({slurm.minutes(self.place.allocation_s)} min)"
            return GateResult(name=gate, status="inconclusive", reason=f"the allocation ran out: job {self.job} "
                              f"TIMEOUT at its limit (step {record.get('JobID')} {record.get('State')}); the gate's "
                              f"own limit is {timeout_s} s", log=log_tail)
        if timed_out or state == "TIMEOUT":
            how = "cancelled by the builder at the limit" if timed_out else "Slurm TIMEOUT at the step's --time"
            return GateResult(name=gate, status="fail", reason=f"timed out: over the gate's time limit of {timeout_s} s "
                              f"(step {record.get('JobID')}: {how})", evidence=Evidence(timeout_s=timeout_s), log=log_tail)
        if (state == "CANCELLED" or job.get("JobState") == "CANCELLED") and name not in self.cancelled_by_us:
            whole = job.get("JobState") == "CANCELLED"
            if whole:
                self.ended = f"allocation {self.job} was cancelled outside the builder (scancel)"
            return GateResult(name=gate, status="inconclusive", reason=f"cancelled outside the builder (scancel): "
                              f"{'job ' + str(self.job) if whole else 'step ' + str(record.get('JobID'))} CANCELLED; "
                              f"step {record.get('JobID')} {record.get('State')}", log=log_tail)
        return None

    def _layout(self) -> Layout:
        """The recipe's node layout: rank 0 trains, rank 1 serves the rollout at the node's address (the port is
        the step's reserved one: the task reads it from SLURM_STEP_RESV_PORTS)."""
        if self.place.nodes < 2:
            return Layout(nodes=1)
        return Layout(nodes=self.place.nodes, hosts=tuple(x.name for x in self.nodes),
                      rollout_host=self.nodes[1].address if len(self.nodes) > 1 else None)

    def _placement(self) -> Placement:
        """What every gate's settings say of this cluster: the caches in the container's private /tmp, the layout,
        and the node-local JIT cache the task binds at the cache directory (when the site has node-local disk)."""
        return Placement(cache_dir=SCRATCH_CACHE, layout=self._layout(),
                         jit_dir=SCRATCH_CACHE if self.place.node_local_dir else None, jit_key=self.jit_key())

    def _sqsh_on_node(self) -> str:
        """The file each node mounts: its verified node-local copy (named by sha256), else the shared file."""
        if not self.place.node_local_dir:
            return self.sqsh.path
        return nodecheck.local_path(self.place.node_local_dir, self.sqsh.sha256)

    def jit_key(self) -> str:
        """The node-local JIT cache's isolation: the image (.sqsh sha256), the components' commits; the node's GPU
        architecture and the rank follow in the path (builder/runners/nodecheck.py writes the architecture)."""
        commits = ",".join(f"{n}={c.commit}" for n, c in sorted(self.pins.components.items()))
        return f"{self.sqsh.sha256[:16]}-{hashlib.sha256(commits.encode()).hexdigest()[:12]}"

    def _jit_dir(self) -> str | None:
        """A task's JIT cache on its node's local disk, mounted at the container's cache directory (never noexec:
        the node check refuses such a disk); none without node-local disk (a fresh cache per gate)."""
        if not self.place.node_local_dir:
            return None
        local = self.place.node_local_dir.replace("%n", "$SLURMD_NODENAME")
        arch = f'$(cat "{self.work}/arch-$SLURMD_NODENAME")'
        return f"{local}/jit/{self.jit_key()}-{arch}/rank$SLURM_PROCID"

    def _scratch(self) -> tuple[str, str] | None:
        """Checkpoint mode's scratch (pins: acceptance.checkpoint.scratch at its dir), the only writable data mount."""
        ckpt = self.pins.acceptance.checkpoint
        if self.pins.acceptance.weights == "checkpoint" and ckpt is not None and ckpt.scratch:
            return ckpt.scratch, ckpt.dir
        return None

    def _pass_env(self) -> tuple[str, ...]:
        """The variables of a node's own environment (its Slurm task: TaskProlog exports included) that reach the
        container: the names the recipe's env and both arms set; the report shows them per node and process."""
        recipe = self.pins.recipe
        return tuple(sorted({*recipe.env, *recipe.aligned_env, *recipe.control_env}))

    def _cancel_step(self, name: str) -> None:
        self.cancelled_by_us.add(name)
        step = next((r["JobID"] for r in slurm.records(self.job or "") if r["JobName"] == name), None)
        if step:
            slurm.cancel(step)
        elif self.live is not None:
            self.live.terminate()

    # ---- the report and the end --------------------------------------------------------------

    def describe(self) -> SlurmFacts:
        version = self.nodes[0].runtime_version if self.nodes else None
        isolation = self.runtime.isolation()
        return SlurmFacts.model_validate({
            "runner": self.kind, "engine": f"Slurm cluster {self.cluster}, {self.runtime.name} {version}",
            "runtime": self.runtime.name, "runtime_version": version, "isolation": isolation,
            "cluster": self.cluster, "job_id": self.job, "partition": self.place.partition or _partition(self.job),
            "nodes": [x.record() for x in self.nodes], "sqsh": self.sqsh.model_dump(),
            "srun_args": list(self.place.srun_args), "network": isolation["network"], "layout": self._layout().wire(),
            "limits": {"allocation_s": self.place.allocation_s, "allocation_limit_s": self.place.allocation_limit_s,
                       "check_s": self.place.check_s, "margin_s": self.place.margin_s}})

    def close(self) -> None:
        """Cancel this runner's job (exactly its ID) and wait until Slurm no longer lists it."""
        if self.live is not None and self.live.poll() is None:
            self.live.terminate()
        if self.job is not None:
            slurm.cancel(self.job)
            deadline = time.monotonic() + 30
            for pause in slurm.pauses():
                if time.monotonic() >= deadline or slurm.job_state(self.job).get("JobState") not in (
                        "RUNNING", "PENDING", "COMPLETING", "CONFIGURING", "SUSPENDED"):
                    break
                time.sleep(pause)
        if self.live is not None:
            try:
                self.live.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.live.kill()
        shutil.rmtree(self.work, ignore_errors=True)


RANK, RANK_KEYS = TypeAdapter(Rank), ("role", "status", "reason", "evidence")  # another rank's line, checked


def _merge_roles(result: GateResult, others: list[dict[str, Any] | None], nodes: list[nodecheck.Node]) -> GateResult:
    """Rank 0's result with every other rank's (the rollout node's census and process judgement): a rank that
    failed, or printed no result, fails the gate naming its node; the census rows of every node are kept."""
    if not others:
        return result
    ev = result.evidence
    census: Census = ev.census.copy() if isinstance(ev.census, dict) else {}
    status, reasons = result.status, [] if result.status == "pass" else [result.reason]
    ranks: list[Rank] = []
    mine = census.get("image")
    for rank, other in enumerate(others, start=1):
        node = nodes[rank].name if rank < len(nodes) else f"rank {rank}"
        if other is None:
            status = "fail"
            reasons.insert(0, f"node {node} (rank {rank}): the rollout role printed no result")
            continue
        seen = RANK.validate_python({"rank": rank, "node": node, **{k: other.get(k) for k in RANK_KEYS}})
        theirs = (seen.get("evidence") or {}).get("census")
        theirs = theirs if isinstance(theirs, dict) else {}
        census["nodes"] = {**(census.get("nodes") or {}), **(theirs.get("nodes") or {})}  # per node: seen, recorded
        census["images"] = {**(census.get("images") or {}), node: theirs.get("image")}
        if mine and theirs.get("image") and theirs.get("image") != mine:  # every node must run the same image
            status = "fail"
            reasons.insert(0, f"node {node} (rank {rank}) runs image {str(theirs.get('image'))[:16]}..., rank 0 "
                              f"({nodes[0].name if nodes else 'rank 0'}) runs {str(mine)[:16]}...")
        ranks.append(seen)
        if seen.get("status") == "fail":
            status = "fail"
            reasons.insert(0, f"node {node} (rank {rank}): {seen.get('reason')}")
        elif seen.get("status") == "inconclusive" and status == "pass":
            status = "inconclusive"
            reasons.insert(0, f"node {node} (rank {rank}): {seen.get('reason')}")
    served = all(o is not None and o.get("status") == "pass" for o in others)
    address = (((ev.run or {}).get("layout") or {}).get("address")) or ""
    named = bool(address) and address in result.reason + result.log  # the recipe says it could not reach the peer
    ran = any(bool(row) for row in (ev.steps or {}).values())  # a step logged metrics
    if result.status == "fail" and not ran and not served and named:  # the link failed, not the stack
        peer = nodes[1].name if len(nodes) > 1 else "rank 1"
        status = "inconclusive"
        reasons.insert(0, f"the link between ranks failed: the trainer on {nodes[0].name if nodes else 'rank 0'} "
                          f"never reached the rollout rank on {peer} at {address}")
    return GateResult(name=result.name, status=status, reason="; ".join(reasons) or result.reason,
                      evidence=ev.model_copy(update={"census": census, "ranks": ranks}), log=result.log)


def _with_logs(result: GateResult, logs: dict[str, str]) -> GateResult:
    """The gate's result with every rank's log in its evidence (the report writes each to a file of its own)."""
    return result.model_copy(update={"evidence": Evidence.model_validate({**result.evidence.as_dict(),
                                                                         "rank_logs": logs})})


def _fuse_gone(errs: list[str]) -> str:
    """The tasks' lines saying the FUSE server of their .sqsh mount went away mid-gate (runtimes.FUSE_LINE), as one
    reason; "" when none did."""
    lines = [line[len(runtimes.FUSE_LINE):].strip() for err in errs for line in err.splitlines()
             if line.startswith(runtimes.FUSE_LINE)]
    return "; ".join(lines)


def _text(path: Path) -> str:
    """A task's output file ("" when Slurm wrote none: a task that never started)."""
    return path.read_text(errors="replace") if path.exists() else ""


def _exit_code(text: str | None, rc: int) -> int:
    """sacct's ExitCode is 'code:signal'."""
    try:
        code, _, sig = (text or "").partition(":")
        return int(code) if int(code) or not int(sig or 0) else 128 + int(sig)
    except ValueError:
        return rc


def _node_down(job: dict[str, str]) -> bool:
    return "NodeDown" in job.get("Reason", "") or "node_fail" in job.get("Reason", "").lower()


def _down_nodes(names: list[str]) -> list[str]:
    """The allocation's nodes Slurm has set down (a drain is not a failure: running steps go on)."""
    states = slurm.node_states(names)
    return [n for n in names if states.get(n, "").split("+")[0].rstrip("*~#") in ("down", "fail", "failing")]


def _partition(job: str | None) -> str | None:
    return slurm.job_state(job).get("Partition") if job else None


def dumps(data: Any) -> str:
    return json.dumps(data, sort_keys=True)
