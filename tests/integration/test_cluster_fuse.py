"""A killed FUSE server does not hang a node. The hang, reproduced here: a gate reads its .sqsh through FUSE; another
process holds the connection's /dev/fuse (HOLD: pidfd_getfd of the server's descriptor) and takes one request off
it that it never answers, as a server killed between reading a request and replying leaves it; then the server is
killed. The kernel aborts a connection only when its last /dev/fuse closes, so the gate waits on; once Slurm
kills it, it waits in D state (unkillable) for as long as the other descriptor lives. The gate's task ends its own
connection when its server is gone (builder/runners/slurm_runtimes.py, through the fusectl demo/cluster.py mounts): the
gate is inconclusive naming the node, no process is left in D state, and a rerun passes. Both servers: ch-run's own
(libsquashfuse_ll, a .sqsh without data mounts) and squashfuse under the overlay root (pins with data mounts)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from builder.pins import model
from demo import cluster
from tests.integration.test_cluster_faults import ROOT, nothing_left, provenance, runner, tiny_sqsh

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# the image's python: opens a file and lists a directory of the image every 0.2 s (FUSE requests each time), 300
# times when its settings' recipe env names HOLD (long enough to be caught), else 5 times
LOOP = """#!/bin/sh
n=5
case "$(cat "${6#@}")" in *'"HOLD"'*) n=300;; esac
i=0
while [ $i -lt $n ]; do read x < /etc/environment && : /etc/* && sleep 0.2 || exit 1; i=$((i + 1)); done
echo "{\\"name\\": \\"$4\\", \\"status\\": \\"pass\\", \\"reason\\": \\"read the image $n times\\", \\"evidence\\": {}}"
"""

# Holds the server's /dev/fuse (argv: server pid, its descriptor), stops the server and takes the next request a
# process waits on (not FORGET, RELEASE, INTERRUPT, ...); prints the waiting process' pid, then never answers.
HOLD = r"""
import ctypes, os, signal, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
server, fd = int(sys.argv[1]), int(sys.argv[2])
held = libc.syscall(438, os.pidfd_open(server), fd, 0)  # pidfd_getfd
if held < 0:
    raise OSError(ctypes.get_errno(), "pidfd_getfd")
os.kill(server, signal.SIGSTOP)
while True:
    header = os.read(held, (1 << 20) + 4096)
    _, opcode, _, _, _, _, pid = struct.unpack_from("<IIQQIII", header)
    if opcode not in (2, 18, 29, 36, 42):  # FORGET RELEASE RELEASEDIR INTERRUPT BATCH_FORGET: nobody waits on them
        break
print(pid, opcode, flush=True)
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def pins() -> model.Pins:
    loaded = model.load(ROOT / "pins" / "demo.yaml")
    return loaded.model_copy(update={"base": loaded.base.model_copy(update={"python_bin": "/usr/bin/python"})})


def fuse_server(word: str, node: str, deadline_s: float = 60) -> tuple[int, int]:
    """(pid, /dev/fuse descriptor) of the process serving node `node`'s gate mount: its command line has `word`.
    The gate's own ch-run (--private-tmp) or squashfuse: the node check's ch-run (`ch-run --unset-env='*' X.sqsh
    -- ...`, a step of the same allocation) mounts the .sqsh briefly too, and under load it may still run."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                gate = argv[0].endswith(b"squashfuse") or (argv[0].endswith(b"ch-run") and b"--private-tmp" in argv)
                if not gate or word.encode() not in b" ".join(argv):
                    continue
                environ = (proc / "environ").read_bytes().split(b"\0")
                fds = [fd for fd in (proc / "fd").iterdir() if os.readlink(fd) == "/dev/fuse"]
            except OSError:
                continue
            mine = f"SLURMD_NODENAME={node}".encode() in environ and b"SLURM_JOB_NAME=sqsh-check" not in environ
            if mine and fds:  # the gate's server on that node (the node check mounts the .sqsh briefly too)
                return int(proc.name), int(fds[0].name)
        time.sleep(0.2)
    raise AssertionError(f"no FUSE server of {word} on {node} within {deadline_s:.0f} s")


def stuck() -> list[str]:
    """Processes in D state waiting on FUSE (state from /proc/PID/stat, the wait from wchan)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
            wchan = (stat.parent / "wchan").read_text() if state == "D" else ""
        except (OSError, IndexError):
            continue
        if state == "D" and ("fuse" in wchan or "request_wait" in wchan):
            found.append(f"{stat.parent.name} {wchan}")
    return found


def kill_mid_gate(pins: model.Pins, sqsh: Path, shared: Path, word: str) -> tuple[Any, int]:
    """Run the gate, hold its rank-0 mount's connection and kill its server mid-gate: (result, the waiting pid)."""
    r = runner(pins, sqsh, shared, timeout_s=120)
    held = pins.model_copy(update={"recipe": pins.recipe.model_copy(update={"env": {**pins.recipe.env, "HOLD": "1"}})})
    done: dict[str, Any] = {}
    gate = threading.Thread(target=lambda: done.update(result=r.run(provenance(held), 120)))
    holder, server = None, 0
    try:
        gate.start()
        server, fd = fuse_server(word, "n1")
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(server), str(fd)], stdout=subprocess.PIPE,
                                  text=True)
        assert holder.stdout is not None and select.select([holder.stdout], [], [], 30)[0], "no request held"
        waiting = int(holder.stdout.readline().split()[0])
        os.kill(server, signal.SIGKILL)
        gate.join(timeout=90)
        assert not gate.is_alive(), "the gate did not end after its FUSE server was killed"
        deadline = time.monotonic() + 15  # Slurm ends the step's last processes a moment after the task
        while (stuck() or Path(f"/proc/{waiting}").exists()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not stuck(), f"processes in D state on FUSE: {stuck()}"
        assert not Path(f"/proc/{waiting}").exists(), f"the process waiting on the held request ({waiting}) is left"
        return done["result"][0], waiting
    finally:
        if holder is not None:  # the last /dev/fuse closes: the kernel aborts the connection whatever happened
            holder.kill()
            holder.communicate()
        try:  # a server the holder stopped and the test did not kill (it failed first): a stopped server hangs too
            if word.encode() in Path(f"/proc/{server}/cmdline").read_bytes():
                os.kill(server, signal.SIGKILL)
        except OSError:
            pass
        gate.join(timeout=60)
        r.close()


@pytest.mark.parametrize("route", ["ch-run", "overlay"])
def test_a_killed_fuse_server_leaves_no_process_in_d_state_and_a_rerun_passes(
        slurm_cluster: cluster.Cluster, pins: model.Pins, tmp_path: Path, route: str) -> None:
    sqsh = tiny_sqsh(tmp_path, 0, LOOP)
    if route == "overlay":  # a data mount: squashfuse serves the .sqsh under the task's overlay root
        (tmp_path / "model").mkdir()
        acc = pins.acceptance
        pins = pins.model_copy(update={"acceptance": acc.model_copy(update={
            "mounts": [model.Mount(source=str(tmp_path / "model"), target="/models/seed")]})})
    result, _ = kill_mid_gate(pins, sqsh, tmp_path / "shared", str(sqsh))  # its path: this test's own servers
    assert result.status == "inconclusive", (result.status, result.reason, result.log)
    server = "ch-run" if route == "ch-run" else "squashfuse"
    assert result.reason.startswith(f"node n1: the FUSE server of the .sqsh mount ({server}, pid"), result.reason
    assert "FUSE connection" in result.reason and result.reason.endswith("aborted"), result.reason
    r = runner(pins, sqsh, tmp_path / "shared")
    try:
        again, _ = r.run(provenance(pins), 60)
    finally:
        r.close()
    assert again.status == "pass" and again.reason == "read the image 5 times", (again.reason, again.log)
    nothing_left(sqsh)
