"""The Slurm runner on the real two-node cluster (demo/cluster.py), with a tiny .sqsh made here from
host binaries: its `python` is a shell script that sleeps $FAKE_SLEEP seconds (from the image's
/etc/environment) and prints a passing result line. The fault table's rows run through the CLI in
tests/integration/test_cluster_cli_faults.py; here: the record of a passing gate, node-local staging, a .sqsh changed
after export, a rank on another image, the facts as JSON, and read-only data mounts."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from builder.core import files
from builder.core.options import Settings
from builder.core.records import SqshFacts
from builder.gating import plan
from builder.gating.settings import GateCall, GateSettings
from builder.pins import model
from builder.runners import slurm
from builder.runners.slurm_runner import SlurmRunner
from demo import cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
FAKE = """#!/bin/sh
# python -m acceptance gate GATE --settings JSON
sleep "${FAKE_SLEEP:-0}"
echo "{\\"name\\": \\"$4\\", \\"status\\": \\"pass\\", \\"reason\\": \\"fake gate ran\\", \\"evidence\\": {}}"
"""


# like FAKE, and its census names the image it runs in (IMAGE: each tiny image its own)
IMAGE_SAYS = """#!/bin/sh
printf '{"name": "%s", "status": "pass", "reason": "ran", "evidence": {"census": {"image": "IMAGE"}}}\\n' "$4"
"""


WRITER = """#!/bin/sh
# the data mount at MODEL must read and refuse a write; the checkpoint scratch at SAVES must take one
read=$(cat MODEL/model.txt 2>&1)
if echo x 2>/dev/null > MODEL/written; then ro="writable"; else ro="refused"; fi
echo saved > SAVES/step-1 && saved=yes || saved=no
echo "{\\"name\\": \\"$4\\", \\"status\\": \\"pass\\", \\"reason\\": \\"read=$read write=$ro saved=$saved\\", \\"evidence\\": {}}"
"""


def tiny_root(root: Path, sleep: int, python_bin: str, python: str = FAKE) -> Path:
    """A root of the host's sh, sleep and cat (with their libraries), the fake python at `python_bin`, FAKE_SLEEP
    in its /etc/environment."""
    for sub in ("bin", "etc", "dev", "proc", "sys", "tmp", "home", "mnt", python_bin.rsplit("/", 1)[0].lstrip("/")):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for binary in ("/bin/sh", "/bin/sleep", "/bin/cat"):
        shutil.copy(binary, root / "bin")
        libs = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
        for lib in [w for w in libs.split() if w.startswith("/")]:
            (root / lib[1:]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(lib, root / lib[1:])
    for name in ("passwd", "group", "hosts", "resolv.conf"):
        (root / "etc" / name).touch()
    (root / "etc" / "environment").write_text(f"FAKE_SLEEP={sleep}\nPATH=/bin:/usr/bin\n")
    (root / python_bin.lstrip("/")).write_text(python)
    (root / python_bin.lstrip("/")).chmod(0o755)
    return root


def tiny_sqsh(dest: Path, sleep: int, python: str = FAKE) -> Path:
    """A SquashFS of tiny_root, its python at /usr/bin/python."""
    root = tiny_root(dest / f"root-{sleep}-{len(python)}", sleep, "/usr/bin/python", python)
    out = dest / f"tiny-{sleep}-{len(python)}.sqsh"
    subprocess.run(["mksquashfs", str(root), str(out), "-noappend", "-quiet", "-no-progress"], check=True,
                   capture_output=True)
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("tiny")
    return {"quick": tiny_sqsh(where, 0), "slow": tiny_sqsh(where, 60)}


@pytest.fixture(scope="module")
def pins() -> model.Pins:
    loaded = model.load(ROOT / "pins" / "demo.yaml")
    return loaded.model_copy(update={"base": loaded.base.model_copy(update={"python_bin": "/usr/bin/python"})})


def runner(pins: model.Pins, sqsh: Path, tmp_path: Path, sha256: str | None = None, timeout_s: int = 120,
           local: str | None = None) -> SlurmRunner:
    """The runner of a two-node plan (the recipe's layout spans the demo cluster's n1 and n2), as `accept --slurm`
    makes it: the pins' acceptance.slurm, the gate's limit from the flags."""
    acc = pins.acceptance
    site = acc.slurm.model_copy(update={"shared_dir": str(tmp_path), "node_local_dir": local})
    pins = pins.model_copy(update={"acceptance": acc.model_copy(update={"nodes": 2, "slurm": site})})
    made = plan.make(pins, plan.Flags(slurm=True, gates=["provenance"], timeout_s=timeout_s), Settings.from_env())
    return SlurmRunner(pins, made.acceptance, SqshFacts(path=str(sqsh), sha256=sha256 or files.sha256_file(sqsh)))


def provenance(pins: model.Pins) -> GateCall:
    """The provenance gate's call (the tiny images' python answers any gate without reading its settings)."""
    return GateCall("provenance", GateSettings.of(pins))


def nothing_left(sqsh: Path) -> None:
    deadline = time.monotonic() + 30
    for pause in slurm.pauses():
        queue = slurm.call(["squeue", "-h", "-o", "%i %j"], "squeue").strip()
        procs = subprocess.run(["pgrep", "-f", f"(ch-run|squashfuse).*{sqsh.name}"], capture_output=True,
                               text=True).stdout
        if not queue and not procs.strip() or time.monotonic() >= deadline:
            break
        time.sleep(pause)
    if not queue and not procs.strip():
        return
    raise AssertionError(f"left behind: squeue {queue!r}, ch-run or squashfuse processes {procs!r}")


def run_one(pins: model.Pins, sqsh: Path, tmp_path: Path, timeout_s: int = 120, sha256: str | None = None,
            local: str | None = None) -> tuple[Any, dict[str, Any]]:
    r = runner(pins, sqsh, tmp_path, sha256, timeout_s, local)
    try:
        return r.run(provenance(pins), timeout_s)
    finally:
        r.close()


def test_gate_passes_and_slurm_record_is_reported(slurm_cluster: cluster.Cluster, pins: model.Pins,
                                                 images: dict[str, Path], tmp_path: Path) -> None:
    result, facts = run_one(pins, images["quick"], tmp_path)
    assert result.status == "pass", (result.reason, result.log)
    assert facts["state"] == "COMPLETED" and facts["nodes"] == ["n1", "n2"] and facts["node"] == "n[1-2]"
    assert facts["exit_code"] == "0:0" and facts["step"].startswith(f"{facts['job_id']}.")
    logs = result.evidence.rank_logs or {}  # every rank's log is kept, not only rank 0's
    assert set(logs) == {"rank0 n1", "rank1 n2"} and '"reason": "fake gate ran"' in logs["rank1 n2"], logs
    nothing_left(images["quick"])


def test_every_node_hashes_its_node_local_copy_filled_under_a_lock_then_reused(
        slurm_cluster: cluster.Cluster, pins: model.Pins, images: dict[str, Path], tmp_path: Path) -> None:
    want = files.sha256_file(images["quick"])
    local = str(tmp_path / "nodes" / "%n")
    for expected in ("filled", "hit"):
        r = runner(pins, images["quick"], tmp_path / "shared", local=local)
        try:
            result, _ = r.run(provenance(pins), 60)
        finally:
            r.close()
        assert result.status == "pass", (result.reason, result.log)
        seen = {n.name: n.model_dump() for n in r.describe().nodes}
        assert set(seen) == {"n1", "n2"} and all(n["sqsh_sha256"] == want for n in seen.values())
        assert all(n["staged"] == expected and n["sqsh_path"] == f"{tmp_path}/nodes/{name}/{want}.sqsh"
                   for name, n in seen.items()), seen
    assert not list(tmp_path.glob("nodes/*/*.part.*"))


def test_sqsh_changed_after_export_fails_the_gate(slurm_cluster: cluster.Cluster, pins: model.Pins,
                                                  images: dict[str, Path], tmp_path: Path) -> None:
    changed = tmp_path / "changed.sqsh"
    shutil.copy(images["quick"], changed)
    recorded = files.sha256_file(changed)
    with open(changed, "ab") as handle:
        handle.write(b"\0")
    result, _ = run_one(pins, changed, tmp_path / "w", sha256=recorded)
    assert result.status == "fail" and ".sqsh sha256 on the node" in result.reason and recorded[:16] in result.reason
    assert result.reason.startswith("node n1")
    nothing_left(changed)


def test_a_rank_on_another_image_fails_the_gate_naming_its_node(slurm_cluster: cluster.Cluster, pins: model.Pins,
                                                                tmp_path: Path) -> None:
    """A real two-node run in which n2 mounts another image: its node-local copy is replaced after the node check
    hashed it (the window a stale or swapped copy would use). Rank 1's census names the other image; the gate fails
    naming n2 (builder/runners/slurm_runner.py _merge_roles; dropping its image comparison passes the gate, seen)."""
    mine = tiny_sqsh(tmp_path / "a", 0, IMAGE_SAYS.replace("IMAGE", "sha256:" + "a" * 64))
    theirs = tiny_sqsh(tmp_path / "b", 0, IMAGE_SAYS.replace("IMAGE", "sha256:" + "b" * 64))
    r = runner(pins, mine, tmp_path / "shared", local=str(tmp_path / "nodes" / "%n"))
    try:
        r._allocate()  # the allocation and the check: each node's copy filled and hashed
        shutil.copyfile(theirs, tmp_path / "nodes" / "n2" / f"{files.sha256_file(mine)}.sqsh")
        result, _ = r.run(provenance(pins), 60)
    finally:
        r.close()
    assert result.status == "fail", (result.reason, result.log)
    assert result.reason.startswith("node n2 (rank 1) runs image sha256:bbbbbbbbb..., rank 0 (n1) runs "
                                    "sha256:aaaaaaaaa..."), result.reason
    assert result.evidence.model_dump(mode="json")["census"]["images"] == {"n2": "sha256:" + "b" * 64}


def test_report_facts_are_json(slurm_cluster: cluster.Cluster, pins: model.Pins, images: dict[str, Path],
                               tmp_path: Path) -> None:
    r = runner(pins, images["quick"], tmp_path)
    try:
        r.run(provenance(pins), 60)
    finally:
        r.close()
    described = r.describe().model_dump(mode="json")
    json.dumps(described)
    assert described["isolation"]["network"].startswith("host:") and all(n["check"]["mb_per_s"]
                                                                         for n in described["nodes"])
    assert described["limits"]["allocation_s"] == 120 + plan.CHECK_S + plan.MARGIN_S


def test_data_mounts_are_read_only_and_the_checkpoint_scratch_writable_under_slurm(
        slurm_cluster: cluster.Cluster, pins: model.Pins, tmp_path: Path) -> None:
    """ch-run binds read-write; the task's own user and mount namespace makes each data mount's source a read-only
    bind first, so the gate reads the model and fails to write it; the checkpoint scratch takes the saves. Targets
    the image has (/mnt, /home) and targets it lacks (Docker's /models/..., /scratch/...: the task's read-only
    overlayfs over the squashfuse-mounted .sqsh makes them, runtimes.overlay_root) alike; no squashfuse is left."""
    data, scratch = tmp_path / "model", tmp_path / "scratch"
    data.mkdir()
    scratch.mkdir()
    (data / "model.txt").write_text("weights")
    acc = pins.acceptance
    for target, saves in (("/mnt", "/home"), ("/models/seed", "/scratch/checkpoints")):
        sqsh = tiny_sqsh(tmp_path, 0, WRITER.replace("MODEL", target).replace("SAVES", saves))
        ckpt = model.Checkpoint.model_validate({"overrides": {"trainer.save_freq": 1}, "layout": "global_step_{step}",
                                                 "scratch": str(scratch), "dir": saves})
        mounted = pins.model_copy(update={"acceptance": acc.model_copy(update={
            "mounts": [model.Mount(source=str(data), target=target)], "weights": "checkpoint", "checkpoint": ckpt})})
        result, _ = run_one(mounted, sqsh, tmp_path / "shared")
        assert result.status == "pass" and result.reason == "read=weights write=refused saved=yes", \
            (target, result.reason, result.log)
        assert not (data / "written").exists() and (scratch / "step-1").read_text() == "saved\n", target
        (scratch / "step-1").unlink()
        nothing_left(sqsh)
