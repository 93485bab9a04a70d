"""Mount targets the image does not have, under ch-run (builder/runners/slurm_runtimes.py overlay_root): a task with data
mounts runs ch-run on a read-only overlayfs of the squashfuse-mounted .sqsh and a directory of mount points, made
and unmounted in its own namespace; the node check makes that root once and names the targets when it cannot."""
import subprocess

from builder.runners import nodecheck
from builder.runners.slurm_runtimes import Charliecloud, GateSpec

SPEC = GateSpec(sqsh="/shared/candidate.sqsh", out_dir="/out", env_file="/out/env", env={}, command=["python", "-V"])


def test_a_task_with_mounts_runs_on_the_overlay_root_and_unmounts_it() -> None:
    spec = GateSpec(**{**SPEC.__dict__, "mounts": (("/data/model", "/models/tinyrl-seed-1"),),
                       "scratch": ("/data/scratch", "/scratch/checkpoints")})
    script = Charliecloud().argv(spec)[2]
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    assert script.count('"$w/pts"') == 2 and "/models/tinyrl-seed-1" in script and "/scratch/checkpoints" in script
    assert '{ squashfuse -f "/shared/candidate.sqsh" "$w/img" & s=$!; }' in script and "lowerdir=$w/pts:$w/img" in script
    assert '--cd=/tmp "$w/root" --' in script and "/shared/candidate.sqsh\" --" not in script
    assert script.index("ch-run --private-tmp") < script.index('umount "$w/root" && umount "$w/img"')
    plain = Charliecloud().argv(SPEC)[2]  # no data mount: ch-run mounts the .sqsh itself, as before
    assert "squashfuse" not in plain and '; ch-run --private-tmp' in plain and '"/shared/candidate.sqsh" --' in plain


def test_the_node_check_makes_the_root_once_and_names_the_targets_when_it_cannot() -> None:
    script = nodecheck.script(Charliecloud(), ["/models/tinyrl-seed-1", "/scratch/checkpoints"])
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    assert "missing_mount=/models/tinyrl-seed-1,/scratch/checkpoints" in script and "squashfuse" in script
    node = nodecheck.parse("node=n1\nsha256=ab\nmissing_mount=/models/tinyrl-seed-1\n", {})
    why, image_fault = nodecheck.verdict([node], "ab", 1, 0, "", needs_env=False)
    assert why is not None and not image_fault
    assert why.startswith("acceptance.mounts: could not make the mount points /models/tinyrl-seed-1 on node n1")
    assert "\n" not in why
