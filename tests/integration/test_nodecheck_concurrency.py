"""Four jobs staging the same .sqsh to one node's empty local directory at once: the per-node lock makes exactly
one of them copy it (filled) while the others wait and reuse that copy (hit), and no part file is left. The node
check's own script (builder/runners/nodecheck.py) runs directly, four processes started together, so Slurm's CPU
accounting cannot serialize them (the demo nodes would run at most so many one-task jobs at once); without the
lock several of them copy (more than one `filled`), and the test fails."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from builder.runners import nodecheck

JOBS = 4
SIZE = 48 * 1024 * 1024  # large enough that the copies overlap in time (the copy and the hash take ~0.1 s each)


def _script() -> str:
    """The check's script as a node runs it, with the runtime's version and environment commands stubbed."""
    return nodecheck.SCRIPT.replace("VERSION", "echo test-runtime").replace("ENV", "true")


def test_concurrent_jobs_fill_a_node_local_copy_once(tmp_path: Path) -> None:
    src = tmp_path / "shared" / "image.sqsh"
    src.parent.mkdir()
    src.write_bytes(os.urandom(SIZE))
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    local = tmp_path / "nodes" / "%n"
    stubs = tmp_path / "bin"  # no cluster here: scontrol (the node's address) answers nothing at once
    stubs.mkdir()
    (stubs / "scontrol").write_text("#!/bin/sh\nexit 1\n")
    (stubs / "scontrol").chmod(0o755)
    env = {**os.environ, "SLURMD_NODENAME": "n1", "PATH": f"{stubs}:{os.environ['PATH']}"}
    procs = []
    for job in range(JOBS):
        work = tmp_path / f"work-{job}"
        work.mkdir()
        procs.append(subprocess.Popen(["sh", "-c", _script(), "check", str(src), want, str(work), str(local)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    facts = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        facts.append(dict(line.split("=", 1) for line in out.splitlines() if "=" in line))
    copy = tmp_path / "nodes" / "n1" / f"{want}.sqsh"
    assert [f["sha256"] for f in facts] == [want] * JOBS and all(f["path"] == str(copy) for f in facts)
    assert sorted(f["staged"] for f in facts) == ["filled"] + ["hit"] * (JOBS - 1), [f["staged"] for f in facts]
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == want
    assert not list(copy.parent.glob("*.part.*"))
