"""The demo through --slurm on a real two-node cluster: the good demo ACCEPTED from its .sqsh with the recipe across
both nodes (the rollout engine on n2, the trainer on n1), and the planted
defects (slow PR: performance; zero_update; rl_step) caught by the same gate with the same reason as under
Docker (tests/test_accept.py asserts the same words, tests/defects.py, so the Docker gates are not run again
here). One cluster for the session; all four are runs of the session's nightly fleet (conftest: slurm_fleet,
tests/test_cluster_fleet.py), each from its own .sqsh."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from builder.core.constants import GATES
from builder.core.records import Report, SlurmFacts
from builder.report import document
from tests.conftest import FLEET_REPEATS, SETTINGS
from tests.defects import BATCH_INVARIANCE_OFF, REASONS, SKIPPED_WEIGHT_RELOAD, SLOW_EXACT_PATH

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]


def fleet_report(fleet: dict[str, Any], key: str) -> Report:
    path = fleet["runs"][key] / "report.json"
    assert path.is_file(), fleet["proc"].stderr[-3000:]
    return document.load(path)


def test_good_demo_is_accepted_through_slurm(slurm_fleet: dict[str, Any]) -> None:
    """build -> staged digest -> .sqsh on shared storage -> Slurm gates (the four exact ones; performance is B's and
    make demo-cluster's, conftest.slurm_fleet says why) -> report."""
    run_dir: Path = slurm_fleet["runs"]["a"]
    report = fleet_report(slurm_fleet, "a")
    found = {g.name: g for g in report.gates}
    assert report.verdict == "ACCEPTED", {n: (g.status, g.reason) for n, g in found.items()}
    assert {n: g.status for n, g in found.items()} == {n: "not_run" if n == "performance" else "pass" for n in GATES}
    assert report.acceptance is not None and report.acceptance.pulled is not None and report.build is not None
    assert report.acceptance.pulled.ref == report.build.staged  # the gates ran on the staged digest's image
    c = report.acceptance.where
    assert isinstance(c, SlurmFacts) and c.runner == "slurm" and c.runtime == "charliecloud" and c.sqsh is not None
    assert [n.name for n in c.nodes] == ["n1", "n2"] and all(n.sqsh_sha256 == c.sqsh.sha256 for n in c.nodes)
    assert c.sqsh.image_id == report.image_id and c.layout["nodes"] == 2  # the rollout engine on n2
    runs = list(c.gates.values())
    assert len(runs) == 4 and len({f["step"] for f in runs}) == 4  # a fresh container per gate
    assert all(f["state"] == "COMPLETED" and f["exit_code"] == "0:0" and f["job_id"] == c.job_id for f in runs)
    assert all(f["node"] == "n[1-2]" for f in runs)  # every gate's step spans both nodes
    for gate in ("zero_update", "rl_step", "control"):  # each node's processes seen by the census, all recorded
        census = found[gate].evidence.model_dump(mode="json")["census"]
        assert set(census["nodes"]) == {"n1", "n2"} and not any(n["unrecorded"] for n in census["nodes"].values())
    markdown = (run_dir / "report.md").read_text()
    assert str(c.job_id) in markdown and c.sqsh.sha256[:16] in markdown and f"`.sqsh` `{c.sqsh.path}`" in markdown
    assert "| zero_update | n2 |" in markdown  # the census table, per gate and node


@pytest.mark.parametrize("key, defect", [("b", SLOW_EXACT_PATH), ("c", BATCH_INVARIANCE_OFF),
                                         ("d", SKIPPED_WEIGHT_RELOAD)], ids=["performance", "zero_update", "rl_step"])
def test_planted_defect_fails_as_under_docker(slurm_fleet: dict[str, Any], key: str, defect: tuple[str, int]) -> None:
    report = fleet_report(slurm_fleet, key)
    gate, words = REASONS[defect]
    got = {g.name: g for g in report.gates}
    assert report.verdict == "NOT ACCEPTED", (got[gate].status, got[gate].reason)
    if gate == "performance" and got[gate].status == "inconclusive":  # the suite's load: never a pass (docs/gates.md)
        assert "too noisy to decide" in got[gate].reason, got[gate].reason
    else:
        assert got[gate].status == "fail" and words in got[gate].reason, (got[gate].status, got[gate].reason)
    assert report.acceptance is not None and report.acceptance.where.runner == "slurm"
    if gate == "performance":  # the interleaved runs, each a Slurm step of its own
        pairs = got[gate].evidence.pairs
        assert pairs is not None
        assert 2 <= pairs <= FLEET_REPEATS and len(report.acceptance.where.gates[gate].get("runs") or []) == 2 * pairs
    # each defect's run requires (so runs) only its own gate; the others pass in A and under Docker
    assert {n: g.status for n, g in got.items() if n != gate} == {n: "not_run" for n in GATES if n != gate}
    where = report.acceptance.where
    assert isinstance(where, SlurmFacts)
    sqsh = where.sqsh
    assert sqsh is not None and sqsh.image_id == report.image_id and sqsh.compression == SETTINGS.squash_options


def test_a_cluster_accepted_run_replays_under_slurm_where_it_ran(slurm_fleet: dict[str, Any]) -> None:
    """`builder replay` of the fleet's ACCEPTED cluster run: nothing failed (exit 0, no step); `--gate control`
    replays the control arm's bundle as a Slurm step from the same .sqsh (the report's own place) and exits 0 when
    its difference reproduces exactly."""
    import subprocess
    import sys

    report_json = slurm_fleet["runs"]["a"] / "report.json"
    accepted = fleet_report(slurm_fleet, "a").acceptance
    assert accepted is not None and isinstance(accepted.where, SlurmFacts) and accepted.where.sqsh is not None
    env = {**os.environ, "BUILDER_SLURM_SHARED_DIR": str(Path(accepted.where.sqsh.path).parent)}  # its export
    done = subprocess.run([sys.executable, "-m", "builder", "replay", str(report_json)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("nothing failed: ACCEPTED"), done.stdout + done.stderr
    before = set(subprocess.run(["sacct", "-n", "-X", "-o", "JobID"], capture_output=True, text=True).stdout.split())
    again = subprocess.run([sys.executable, "-m", "builder", "replay", str(report_json), "--gate", "control"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "control: the recorded difference reproduces exactly" in again.stdout
    after = set(subprocess.run(["sacct", "-n", "-X", "-o", "JobID"], capture_output=True, text=True).stdout.split())
    assert after - before, "the replay ran no Slurm job"  # it ran where the report's gates ran
