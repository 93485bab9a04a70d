"""The fault table of docs/cluster.md, row by row, through the CLI (`builder accept --slurm`) on the real two-node
local cluster. The candidates are tiny images made here (sh, sleep and a `python` that sleeps $FAKE_SLEEP and prints
a passing result line), so each run costs seconds; their pins require the provenance gate only and span both nodes.

Every row asserts the CLI's own exit code, exactly one `error:` line on stderr, no job of the run left in squeue,
no process of the job left (the pids Slurm listed for the job while it ran, `scontrol listpids JOB NODE` asked of
each node's slurmd: both run on this host, and scontrol lists one node's only; at least one pid per node where a
gate ran, each checked by its start time), nothing published (`builder publish` of the run's report refused, the
release tag unmoved in the registry, no .sqsh placed) and a passing rerun."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.runners import slurm
from demo import cluster
from tests.integration.test_cluster_faults import tiny_root

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "127.0.0.1:5000"
REPOSITORY = "tests/cli-faults"


def tiny_image(dest: Path, sleep: int, python_bin: str) -> str:
    """A Docker image of tiny_root (tests/integration/test_cluster_faults.py): docker import of the tree."""
    root = tiny_root(dest / f"root-{sleep}", sleep, python_bin)
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
    changes = ["--change", f"ENV FAKE_SLEEP={sleep}", "--change", "ENV PATH=/bin:/usr/bin"]  # the export's environment
    return subprocess.run(["docker", "import", *changes, "-", f"builder-tests/tiny-gates:{sleep}"], input=tar,
                          capture_output=True, check=True).stdout.decode().strip()


@dataclass
class World:
    pins: Path
    images: dict[str, str]
    env: dict[str, str]
    published: Path
    tmp: Path


@pytest.fixture(scope="module")
def world(slurm_cluster: cluster.Cluster, demo_pins: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from demo.prepare import variant_pins

    tmp = tmp_path_factory.mktemp("cli-faults")
    published = tmp / "published"
    published.mkdir()

    def edit(data: dict[str, Any]) -> None:
        acc = data["acceptance"]
        acc["required_gates"], acc["nodes"], acc["timeout_s"] = ["provenance"], 2, 120
        acc.pop("performance", None)
        acc["slurm"] = {"publish_dir": str(published)}
        data["image"]["repository"] = f"{REGISTRY}/{REPOSITORY}"

    pins = variant_pins(tmp / "pins", edit=edit, pins_path=demo_pins)
    python_bin = yaml.safe_load(pins.read_text())["base"]["python_bin"]
    images = {"quick": tiny_image(tmp, 0, python_bin), "medium": tiny_image(tmp, 10, python_bin),
              "slow": tiny_image(tmp, 90, python_bin)}
    env = {**os.environ, "BUILDER_SLURM_SHARED_DIR": str(tmp / "shared"), "PYTHONPATH": str(ROOT)}
    yield World(pins, images, env, published, tmp)
    subprocess.run(["docker", "rmi", "-f", *images.values()], capture_output=True, check=False)


class Jobs:
    """The builder's jobs and every pid Slurm listed for them while they ran (pid, start time)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.pids: set[tuple[int, str]] = set()
        self.nodes: dict[str, set[int]] = {}  # per node: the pids its slurmd listed
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        """Every second (a site throttles faster clients: slurm.pauses), the builder's jobs and their pids."""
        for pause in slurm.pauses(most=1.0):
            if self.stop.is_set():
                return
            out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, check=False).stdout
            for line in out.splitlines():
                job, _, name = line.partition(" ")
                if name.startswith("builder-accept-"):
                    self.ids.add(job)
                    for node in cluster.NODES:  # each slurmd lists its own node's pids only
                        listed = subprocess.run(["scontrol", "listpids", job, node], capture_output=True, text=True,
                                                check=False).stdout
                        for row in listed.splitlines()[1:]:
                            pid = row.split()[0] if row.split() else ""
                            if pid.isdigit() and (start := _start(int(pid))):
                                self.pids.add((int(pid), start))
                                self.nodes.setdefault(node, set()).add(int(pid))
            self.stop.wait(pause)

    def left(self) -> tuple[list[str], list[int]]:
        self.stop.set()
        self.thread.join()
        queue = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=False).stdout.split()
        return [j for j in queue if j in self.ids], [pid for pid, start in self.pids if _start(pid) == start]


def _start(pid: int) -> str | None:
    """The process' start time (/proc/<pid>/stat field 22), None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def tag_digest(tag: str) -> str | None:
    request = urllib.request.Request(f"http://{REGISTRY}/v2/{REPOSITORY}/manifests/{tag}", method="HEAD", headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - the local registry
            return str(answer.headers.get("Docker-Content-Digest"))
    except OSError:
        return None


def accept(world: World, image: str, out: Path, *args: str, during: Callable[[subprocess.Popen[str]], None] | None
           = None) -> tuple[int, list[str], Path]:
    """`builder accept --slurm`: (exit code, its error: lines, the run directory)."""
    proc = subprocess.Popen([sys.executable, "-m", "builder", "accept", str(world.pins), "--slurm", "--image",
                             world.images[image], "--out", str(out), *args], env=world.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    thread = threading.Thread(target=during, args=(proc,)) if during else None
    if thread:
        thread.start()
    _, err = proc.communicate(timeout=420)
    if thread:
        thread.join()
    return proc.returncode, [line for line in err.splitlines() if line.startswith("error:")], out


def when_gate_runs(action: Callable[[str], object]) -> Callable[[subprocess.Popen[str]], None]:
    """action(job ID) as soon as a gate step (not the node check) of the builder's job runs."""
    def watch(proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 180
        for pause in slurm.pauses(most=1.0):
            if time.monotonic() >= deadline or proc.poll() is not None:
                return
            steps = subprocess.run(["squeue", "-h", "-s", "-o", "%i %j"], capture_output=True, text=True,
                                   check=False).stdout.splitlines()
            running = [s.split()[0] for s in steps if s.strip() and "provenance-" in s]
            if running:
                time.sleep(1)
                action(running[0].split(".")[0])
                return
            time.sleep(pause)
    return watch


def gate(run: Path) -> dict[str, Any]:
    report = json.loads((run / "report.json").read_text())
    found: dict[str, Any] = next(g for g in report["gates"] if g["name"] == "provenance")
    return found


def publish(world: World, run: Path) -> tuple[int, list[str]]:
    """`builder publish` of the run's report, as the next step of a release would run it."""
    done = subprocess.run([sys.executable, "-m", "builder", "publish", str(run / "report.json")], env=world.env,
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    return done.returncode, [line for line in done.stderr.splitlines() if line.startswith("error:")]


def settled(world: World, jobs: Jobs, tag_before: str | None, run: Path | None = None, ran: bool = False) -> None:
    """Nothing of the run left, nothing published (the publish of its report refused: `run`, where the run wrote
    one), and a rerun passes. `ran`: a gate ran on both nodes, so each node's slurmd listed at least one pid."""
    left_jobs, left_pids = jobs.left()
    assert left_jobs == [] and left_pids == [], (left_jobs, left_pids)
    if ran:  # each node's own pids: some on every node, none listed for two (one node's list asked twice)
        assert {node: bool(jobs.nodes.get(node)) for node in cluster.NODES} == dict.fromkeys(cluster.NODES, True), \
            jobs.nodes
        assert set.intersection(*(jobs.nodes[node] for node in cluster.NODES)) == set(), jobs.nodes
    if run is not None:
        code, errors = publish(world, run)
        assert code == 1 and len(errors) == 1 and "only an ACCEPTED image is published" in errors[0], errors
    assert tag_digest("demo") == tag_before and list(world.published.glob("*.sqsh")) == []
    code, errors, run = accept(world, "quick", world.tmp / f"rerun-{time.monotonic_ns()}")
    assert code == 0 and errors == [], errors
    assert gate(run)["status"] == "pass"


def _daemon_down(world: World, c: cluster.Cluster, daemon: str, words: str) -> None:
    before, jobs = tag_digest("demo"), Jobs()
    os.kill(int(c.pid_file(daemon).read_text().split()[0]), signal.SIGTERM)
    time.sleep(1.5)
    try:
        code, errors, _ = accept(world, "quick", world.tmp / f"{daemon}-down")
        assert code == 3 and len(errors) == 1 and words in errors[0].lower(), errors
    finally:
        cluster.start(c.root)
    settled(world, jobs, before)


def test_slurmctld_down_at_submit_is_exit_3_naming_the_controller(world: World,
                                                                   slurm_cluster: cluster.Cluster) -> None:
    _daemon_down(world, slurm_cluster, "slurmctld", "slurm: scontrol show config")


def test_munged_down_is_exit_3_naming_munge(world: World, slurm_cluster: cluster.Cluster) -> None:
    _daemon_down(world, slurm_cluster, "munged", "munge")


@pytest.mark.parametrize("row", ["node down", "node drained", "over its limit", "someone's scancel", "SIGINT",
                                 "SIGTERM"])
def test_a_fault_mid_gate_ends_as_the_table_says(world: World, slurm_cluster: cluster.Cluster, row: str) -> None:
    before, jobs = tag_digest("demo"), Jobs()
    image, args, during = "medium", [], None
    if row == "node down":
        during = when_gate_runs(lambda job: slurm.call(["scontrol", "update", "nodename=n2", "state=down",
                                                        "reason=test"], "scontrol update"))
    elif row == "node drained":
        during = when_gate_runs(lambda job: slurm.call(["scontrol", "update", "nodename=n2", "state=drain",
                                                        "reason=test"], "scontrol update"))
    elif row == "over its limit":
        args = ["--timeout", "3"]
    elif row == "someone's scancel":
        during = when_gate_runs(lambda job: slurm.cancel(job))
    else:
        sig = signal.SIGINT if row == "SIGINT" else signal.SIGTERM
        holder: list[subprocess.Popen[str]] = []
        during = when_gate_runs(lambda job: holder[0].send_signal(sig))
        during = _with_proc(holder, during)
    try:
        code, errors, run = accept(world, image, world.tmp / row.replace(" ", "-"), *args, during=during)
    finally:
        cluster.resume_node(slurm_cluster)
    if row == "node drained":  # a drain stops no running step: the gate passes, so the run is accepted
        assert code == 0 and errors == [] and gate(run)["status"] == "pass", (errors, gate(run)["reason"])
    elif row in ("SIGINT", "SIGTERM"):
        assert code == 130 and len(errors) == 1 and "interrupt" in errors[0].lower(), errors
    else:
        assert code == 1 and len(errors) == 1 and "not accepted" in errors[0], errors
        found = gate(run)
        words = {"node down": ("inconclusive", "node failure: node(s) n2"),
                 "over its limit": ("fail", "timed out: over the gate's time limit of 3 s"),
                 "someone's scancel": ("inconclusive", "cancelled outside the builder")}[row]
        assert found["status"] == words[0] and found["reason"].startswith(words[1]), found["reason"]
        settled(world, jobs, before, run, ran=True)
        return
    settled(world, jobs, before, ran=True)  # drained: accepted (nothing to refuse); a signal: no report


def _with_proc(holder: list[subprocess.Popen[str]], watch: Callable[[subprocess.Popen[str]], None],
               ) -> Callable[[subprocess.Popen[str]], None]:
    def run(proc: subprocess.Popen[str]) -> None:
        holder.append(proc)
        watch(proc)
    return run


def test_a_signal_while_salloc_is_pending_cancels_the_pending_job(world: World,
                                                                 slurm_cluster: cluster.Cluster) -> None:
    before, jobs = tag_digest("demo"), Jobs()
    other = slurm.call(["sbatch", "--parsable", "-N2", "--exclusive", "--job-name=someone-else", "--output=/dev/null",
                        "--wrap=sleep 300"], "sbatch").strip()

    def when_pending(proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 120
        for pause in slurm.pauses(most=1.0):
            if time.monotonic() >= deadline or proc.poll() is not None:
                return
            out = subprocess.run(["squeue", "-h", "-t", "PD", "-o", "%j"], capture_output=True, text=True,
                                 check=False).stdout
            if "builder-accept-" in out:
                time.sleep(0.5)
                proc.send_signal(signal.SIGINT)
                return
            time.sleep(pause)

    try:
        deadline = time.monotonic() + 60  # an earlier test's job may still be completing on a node: wait it out
        for pause in slurm.pauses():
            if (state := slurm.job_state(other)).get("JobState") == "RUNNING" or time.monotonic() >= deadline:
                break
            time.sleep(pause)
        assert state.get("JobState") == "RUNNING", f"someone else's job never ran: {state.get('JobState')} " \
            f"({state.get('Reason')})"
        code, errors, _ = accept(world, "quick", world.tmp / "pending", during=when_pending)
        assert code == 130 and len(errors) == 1, errors
        assert jobs.ids and slurm.job_state(other).get("JobState") == "RUNNING"  # someone else's: untouched
    finally:
        slurm.cancel(other)
    settled(world, jobs, before)


def test_the_allocation_running_out_mid_gate_is_inconclusive(world: World, slurm_cluster: cluster.Cluster) -> None:
    """The site shortens the allocation (an admin's `scontrol update TimeLimit`): Slurm ends the job at its limit
    while the gate still runs; the gate is inconclusive, naming the allocation, not the gate's own limit.
    Over 60 s (76 s): Slurm's time limits are whole minutes and slurmctld checks them every 30 s (PERIODIC_TIMEOUT),
    so the shortened allocation ends one to one and a half minutes in."""
    before, jobs = tag_digest("demo"), Jobs()
    during = when_gate_runs(lambda job: slurm.call(["scontrol", "update", f"jobid={job}", "TimeLimit=1"],
                                                   "scontrol update TimeLimit"))
    code, errors, run = accept(world, "slow", world.tmp / "ran-out", during=during)
    assert code == 1 and len(errors) == 1 and "not accepted" in errors[0], errors
    found = gate(run)
    assert found["status"] == "inconclusive" and found["reason"].startswith("the allocation ran out"), found["reason"]
    settled(world, jobs, before, run, ran=True)


def test_a_stale_copy_on_one_node_fails_naming_the_node(world: World, slurm_cluster: cluster.Cluster,
                                                        tmp_path: Path) -> None:
    """A different image under the name one node will use (node-local staging): every gate fails naming n2; the
    copy is removed, never mounted, and the rerun fills it again."""
    data = yaml.safe_load(world.pins.read_text())
    data["acceptance"]["slurm"]["node_local_dir"] = str(tmp_path / "nodes" / "%n")
    staged = world.pins.with_name("staged.yaml")
    staged.write_text(yaml.safe_dump(data, sort_keys=False))
    local = World(staged, world.images, world.env, world.published, world.tmp)
    code, errors, run = accept(local, "quick", tmp_path / "first")
    assert code == 0, errors
    want = json.loads((run / "report.json").read_text())["acceptance"]["where"]["sqsh"]["sha256"]
    copy = tmp_path / "nodes" / "n2" / f"{want}.sqsh"
    assert copy.is_file()
    copy.write_bytes(b"another image")
    before, jobs = tag_digest("demo"), Jobs()
    code, errors, run = accept(local, "quick", tmp_path / "stale")
    assert code == 1 and len(errors) == 1
    assert gate(run)["reason"].startswith("node n2: its node-local copy"), gate(run)["reason"]
    assert not copy.exists()
    settled(local, jobs, before, run)
    assert copy.is_file() and hashlib.sha256(copy.read_bytes()).hexdigest() == want  # the rerun filled it again
