"""Faults across nodes with the real demo image, the recipe across the two nodes (the trainer on n1, the rollout
engine on n2, meeting at n2's address and the step's reserved port). A site's TaskProlog on one node plants each:
a variable that changes the rollout engine's numerics (the gate it breaks fails, the report shows the variable),
and another port for the rollout rank (the link between ranks refused: inconclusive, naming both ends). Each is
followed by a passing run once the plant is gone."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.core.records import AcceptanceResult
from builder.engine import client as engine
from builder.gating import plan
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.pins.model import Pins
from builder.report import document
from builder.runners import factory
from demo import cluster
from tests.conftest import SETTINGS
from tests.defects import without_performance
from tests.fixture_types import DemoImage

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]


def two_node_pins(pins: Pins, shared: Path) -> Pins:
    data = pins.to_json_dict()
    data["acceptance"]["nodes"] = 2
    data["acceptance"]["slurm"] = {"shared_dir": str(shared)}
    data["recipe"]["env"] = {**data["recipe"].get("env", {}), "ROLLOUT_CONNECT_TIMEOUT_S": "15"}
    without_performance(data)
    return pins_mod.validate(data, pins.directory)


def run(pins: Pins, image_id: str) -> AcceptanceResult:
    made = plan.make(pins, plan.Flags(slurm=True, gates=["zero_update"], timeout_s=300), SETTINGS).acceptance
    return factory.gate_image(made, pins, image_id, None, SETTINGS, engine.connect(SETTINGS))


@pytest.fixture
def prolog(slurm_cluster: cluster.Cluster) -> Iterator[Path]:
    """n2's TaskProlog input (demo/cluster.py); emptied afterwards."""
    path = slurm_cluster.root / "nodes" / "n2" / "taskprolog.env"
    yield path
    path.unlink(missing_ok=True)


def test_one_nodes_environment_breaks_its_gate_and_the_report_shows_the_variable(
        slurm_cluster: cluster.Cluster, demo_image: DemoImage, cluster_images: tuple[object, Path], prolog: Path,
        tmp_path: Path) -> None:
    pins, resolved, _, built = demo_image
    two = two_node_pins(pins, cluster_images[1])
    prolog.write_text("export DEMO_BATCH_INVARIANT=0\n")  # the site's prolog on n2 turns the switch off there
    result = run(two, built.image_id)
    gate = next(g for g in result.gates if g.name == "zero_update")
    assert gate.status == "fail" and "diff" in gate.reason, gate.reason
    ranks = gate.evidence.model_dump(mode="json")["ranks"]
    assert ranks[0]["node"] == "n2" and ranks[0]["evidence"]["run"]["node_env"] == {"DEMO_BATCH_INVARIANT": "0"}
    markdown = document.to_markdown(document.make_report(two, lock_record.of(pins), resolved, built, result))
    assert "zero_update: node n2 set `DEMO_BATCH_INVARIANT=0`" in markdown
    prolog.unlink()
    again = next(g for g in run(two, built.image_id).gates if g.name == "zero_update")
    assert again.status == "pass", again.reason


def test_the_link_between_ranks_refused_is_inconclusive_naming_both_ends(
        slurm_cluster: cluster.Cluster, demo_image: DemoImage, cluster_images: tuple[object, Path],
        prolog: Path) -> None:
    pins, _, _, built = demo_image
    two = two_node_pins(pins, cluster_images[1])
    prolog.write_text("export SLURM_STEP_RESV_PORTS=1\n")  # n2's rank serves on another port than the step's
    gate = next(g for g in run(two, built.image_id).gates if g.name == "zero_update")
    assert gate.status == "inconclusive", gate.reason
    assert gate.reason.startswith("the link between ranks failed: the trainer on n1 never reached the rollout rank "
                                  "on n2 at 127.0.0.1:"), gate.reason
    prolog.unlink()
    assert next(g for g in run(two, built.image_id).gates if g.name == "zero_update").status == "pass"


def test_jit_caches_live_on_node_local_disk_isolated_by_image_commits_arch_and_rank(
        slurm_cluster: cluster.Cluster, demo_image: DemoImage, cluster_images: tuple[object, Path],
        tmp_path: Path) -> None:
    """A cache entry this image left on the node is used and reported as from the node-local cache; those planted
    under another image's key, under this image with other commits, and under another rank are never seen; a
    noexec node-local disk is refused naming the node."""
    pins, _, _, built = demo_image
    data = two_node_pins(pins, cluster_images[1]).to_json_dict()
    data["acceptance"]["nodes"] = 1
    data["acceptance"]["slurm"]["node_local_dir"] = str(tmp_path / "%n")
    one = pins_mod.validate(data, pins.directory)
    made = plan.make(one, plan.Flags(slurm=True, gates=["provenance", "zero_update"]), SETTINGS).acceptance
    runner, image_id, _ = factory.open_runner(made, one, built.image_id, None, SETTINGS, engine.connect(SETTINGS))
    key = runner.jit_key()  # type: ignore[attr-defined]
    runner.close()
    for node in ("n1", "n2"):
        (tmp_path / node / "jit" / f"{key}-cpu" / "rank0").mkdir(parents=True)
        (tmp_path / node / "jit" / f"{key}-cpu" / "rank0" / "kernel.bin").write_bytes(b"this image's kernel")
        for where, name in ((f"{'f' * 16}-{key[17:]}-cpu/rank0", "foreign.bin"),  # another image
                            (f"{key[:16]}-{'0' * 12}-cpu/rank0", "foreign-commits.bin"),  # this image, other commits
                            (f"{key}-cpu/rank1", "foreign-rank.bin")):  # this image and commits, another rank
            (tmp_path / node / "jit" / where).mkdir(parents=True)
            (tmp_path / node / "jit" / where / name).write_bytes(b"a kernel of another image, commits or rank")
    result = factory.gate_image(made, one, built.image_id, None, SETTINGS, engine.connect(SETTINGS))
    gates = {g.name: g for g in result.gates}
    assert gates["provenance"].status == "pass", gates["provenance"].reason
    listed = gates["provenance"].evidence.model_dump(mode="json")["jit_cache"]
    assert listed["entries"] == 1 and listed["files"][0]["file"].endswith("/kernel.bin"), listed
    entries = gates["zero_update"].evidence.model_dump(mode="json")["jit"]["entries"]
    assert [(e["file"].rsplit("/", 1)[1], e["origin"]) for e in entries] == [
        ("kernel.bin", "from the node-local cache (this image, commits, GPU architecture and rank)")]
    assert "foreign" not in str(result.gates)
    noexec = tmp_path / "noexec"
    noexec.mkdir()
    import subprocess
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,size=16m", "tmpfs", str(noexec)], check=True)
    try:
        data["acceptance"]["slurm"]["node_local_dir"] = str(noexec / "%n")
        bad = pins_mod.validate(data, pins.directory)
        made = plan.make(bad, plan.Flags(slurm=True, gates=["provenance"]), SETTINGS).acceptance
        gate = factory.gate_image(made, bad, built.image_id, None, SETTINGS, engine.connect(SETTINGS)).gates[0]
        assert gate.status == "fail" and "is mounted noexec" in gate.reason and gate.reason.startswith("node n"), \
            gate.reason
    finally:
        subprocess.run(["umount", str(noexec)], check=False)
