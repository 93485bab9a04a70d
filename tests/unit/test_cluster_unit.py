"""The cluster leg without a cluster: the runtimes' command lines (enroot/pyxis is only ever checked here,
never executed), the acceptance.slurm pins section and the --slurm flags, checked by the same rules."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.gating import plan
from builder.lock import record as lock_record
from builder.pins import model
from builder.runners import slurm_runtimes as runtimes

ROOT = Path(__file__).resolve().parents[2]
SPEC = runtimes.GateSpec(sqsh="/shared/img.sqsh", out_dir="/shared/.runs/r/provenance-1",
                         env_file="/shared/.runs/r/environment-n1", env={"HOME": "/tmp/cache"},
                         command=["/opt/venv/bin/python", "-m", "acceptance", "gate", "provenance"])


def test_charliecloud_runs_the_sqsh_read_only_with_the_image_environment_and_one_bind() -> None:
    argv = runtimes.Charliecloud().argv(SPEC)
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3] == "gate" and argv[4:] == SPEC.command
    script = argv[2]
    assert '; ch-run --private-tmp --unset-env="*" --set-env="/shared/.runs/r/environment-n1"' in script
    assert '"/shared/img.sqsh" -- "$@" & c=$!; ' in script and "wait $c; rc=$?; " in script  # watched: FUSE below
    assert script.count("--bind") == 1 and '--bind="$out:/tmp/acceptance"' in script
    assert '"/shared/img.sqsh" -- "$@"' in script and "--write" not in script and "unshare" not in script
    assert 'SLURM_PROCID="$SLURM_PROCID"' in script and "SLURM_STEP_RESV_PORTS" in script
    assert runtimes.Charliecloud().srun_args(SPEC) == []
    assert runtimes.Charliecloud().isolation()["network"].startswith("host:")


def test_a_task_ends_its_own_fuse_connection_once_the_server_is_gone() -> None:
    """The task's watch over its .sqsh mount (tests/integration/test_cluster_fuse.py kills the server for real):
    ch-run's own server, read from ch-run's mountinfo and judged by how ch-run ended; squashfuse's, watched while
    ch-run runs; either way the connection is aborted through fusectl and one line names the node."""
    plain = runtimes.Charliecloud().argv(SPEC)[2]
    mounts = runtimes.Charliecloud().argv(runtimes.GateSpec(**{**SPEC.__dict__, "mounts": (("/m", "/data/m"),)}))[2]
    for script in (plain, mounts):
        assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
        assert 'echo 1 > "/sys/fs/fuse/connections/$n/abort"' in script.replace("'\\''", "'")
        assert "builder-fuse: node $SLURMD_NODENAME: the FUSE server of the .sqsh mount (" in script
        assert f"rc={runtimes.FUSE_GONE}" in script
    assert "/proc/$c/mountinfo" in plain and '[ $rc -gt 128 ] && [ -n "$n" ] && [ -d "/sys/fs/fuse/connections/$n" ]' \
        in plain
    assert '{ squashfuse -f "/shared/img.sqsh" "$w/img" & s=$!; }' in mounts
    assert "& g=$!; wait $c; rc=$?; kill $g 2>/dev/null;" in mounts
    from builder.runners.slurm_runner import _fuse_gone

    line = "node n1: the FUSE server of the .sqsh mount (ch-run, pid 7, ended by signal 9) is gone while the gate " \
           "ran; FUSE connection 42 aborted"
    assert _fuse_gone([f"noise\n{runtimes.FUSE_LINE} {line}\n", ""]) == line
    assert _fuse_gone(["a gate's own stderr", ""]) == ""


def test_charliecloud_data_mounts_are_read_only_binds_in_a_namespace_of_the_task() -> None:
    spec = runtimes.GateSpec(**{**SPEC.__dict__, "mounts": (("/models/m", "/data/model"),), "pass_env": ("DEMO_X",)})
    script = runtimes.Charliecloud().argv(spec)[2]
    assert script.count("exec unshare --user --map-root-user --mount /bin/sh -c") == 1
    plain = script.replace("'", "").replace("\\", "")
    assert "mount --bind /models/m /models/m && mount -o remount,bind,ro /models/m" in plain
    assert "--bind=/models/m:/data/model" in plain
    assert '${DEMO_X+"--set-env=DEMO_X=$DEMO_X"}' in script and "TRUEPOLICY_NODE_ENV=${DEMO_X+DEMO_X,}" in script


def test_enroot_uses_pyxis_documented_flags_only() -> None:
    args = runtimes.Enroot().srun_args(SPEC)
    assert args == ["--container-image=/shared/img.sqsh",
                    "--container-mounts=/shared/.runs/r/provenance-1:/tmp/acceptance:rw+rprivate",
                    "--no-container-mount-home", "--container-readonly", "--container-workdir=/tmp",
                    "--export=NONE,HOME=/tmp/cache"]
    ro = runtimes.GateSpec(**{**SPEC.__dict__, "mounts": (("/models/m", "/data/model"),), "pass_env": ("NCCL_X",)})
    args = runtimes.Enroot().srun_args(ro)
    assert "--container-mounts=/shared/.runs/r/provenance-1:/tmp/acceptance:rw+rprivate,/models/m:/data/model:ro" in args
    assert args[-1] == "--export=NONE,HOME=/tmp/cache,NCCL_X"
    assert runtimes.Enroot().argv(SPEC) == SPEC.command
    assert runtimes.Enroot().env_command("x", "y") is None
    assert runtimes.Enroot().isolation()["executed"].startswith("no: not executed here")


def _pins(**slurm: object) -> model.Pins:
    pins = model.load(ROOT / "pins" / "demo.yaml")
    section = model.Slurm.model_validate(slurm)
    return pins.model_copy(update={"acceptance": pins.acceptance.model_copy(update={"slurm": section})})


@pytest.mark.parametrize("field, value, words", [
    ("partition", "gpu;rm -rf", "Slurm partition"), ("srun_args", ["--jobid=7"], "does not set itself"),
    ("srun_args", ["--constraint=a100 x"], "srun flag"), ("srun_args", ["-w", "n1"], "srun flag"),
    ("shared_dir", "relative/dir", "absolute path"), ("publish_dir", "rel", "absolute path"),
    ("runtime", "docker", "charliecloud")])
def test_bad_slurm_pins_values_are_refused(field: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        model.Slurm.model_validate({field: value})


def test_the_plan_reads_the_site_options_once_and_derives_the_allocation(tmp_path: Path) -> None:
    pins = _pins(partition="gates", srun_args=["--constraint=a100"], shared_dir=str(tmp_path))
    made = plan.make(pins, plan.Flags(slurm=True, timeout_s=100), Settings.from_env()).acceptance
    assert isinstance(made.place, plan.SlurmPlace)
    assert made.place.partition == "gates" and made.place.srun_args == ("--constraint=a100",)
    runs = sum(g.runs for g in made.gates if g.run)
    assert made.place.allocation_s == runs * 100 + plan.CHECK_S + plan.MARGIN_S
    assert all(g.timeout_s == 100 for g in made.gates) and made.place.shared_dir == tmp_path
    assert [g.why for g in made.gates if g.name == "performance"] == ["required by the pins"]


def test_a_plan_whose_allocation_cannot_hold_its_gates_is_refused_naming_both_values() -> None:
    pins = _pins(allocation_limit_s=600)
    with pytest.raises(BadInput, match=r"^acceptance.slurm.allocation_limit_s: 600 s cannot hold the plan's "
                                       r"allocation of \d+ s \(gates \d+ s \+ node check 120 s \+ margin 120 s\)"):
        plan.make(pins, plan.Flags(slurm=True), Settings.from_env())
    made = plan.make(pins, plan.Flags(slurm=True, gates=["provenance"], timeout_s=60), Settings.from_env())
    assert isinstance(made.acceptance.place, plan.SlurmPlace) and made.acceptance.place.allocation_s == 300


def test_the_old_per_gate_slurm_limit_is_refused_saying_where_limits_live() -> None:
    with pytest.raises(ValueError, match="time_limit_s: no longer read: each gate's limit is acceptance.timeout_s"):
        model.Slurm.model_validate({"time_limit_s": 900})


def test_plan_refusals_name_the_flag() -> None:
    pins = model.load(ROOT / "pins" / "demo.yaml")
    with pytest.raises(BadInput, match=r"^--gate: expected one of"):
        plan.make(pins, plan.Flags(gates=["nope"]), Settings.from_env())
    with pytest.raises(BadInput, match=r"^--slurm: expected no --engine"):
        plan.make(pins, plan.Flags(slurm=True, engine_url="tcp://127.0.0.1:1"), Settings.from_env())
    with pytest.raises(BadInput, match=r"^--sqsh: expected --publish too"):
        plan.make(pins, plan.Flags(export=True), Settings.from_env())


def test_the_slurm_flags_are_gone_from_the_commands() -> None:
    from builder.cli import run

    assert run(["nightly", str(ROOT / "pins" / "demo.yaml"), "--slurm-partition", "gates"]) == 2
    assert run(["accept", str(ROOT / "pins" / "demo.yaml"), "--slurm-time-limit", "60"]) == 2


def test_no_module_above_the_runners_names_a_runner_kind() -> None:
    """Only the runners, their factory and the plan know the kinds; the rest read typed facts."""
    allowed = {"builder/runners/docker_runner.py", "builder/gating/gates.py", "builder/runners/runc_runner.py",
               "builder/gating/runner.py",
               "builder/gating/plan.py", "builder/runners/slurm_runner.py", "builder/runners/slurm_runtimes.py",
               "builder/runners/slurm.py", "builder/runners/nodecheck.py", "builder/runners/slurm_candidate.py",
               "builder/runners/factory.py", "builder/cli.py"}
    kinds = re.compile(r"""\brunner\.kind\b|[!=]= *["'](docker|slurm|runc)["']|get\(["']runner["']\)"""
                       r"""|\bSlurmPlace\b|\bDockerPlace\b|\bSlurmRunner\b|\bDockerRunner\b""")
    offenders = [f"{p}:{n}" for p in sorted((ROOT / "builder").rglob("*.py")) if str(p.relative_to(ROOT)) not in allowed
                 for n, line in enumerate(p.read_text().splitlines(), 1) if kinds.search(line.split("#")[0])]
    assert offenders == []


def test_no_string_key_reads_of_the_runner_facts_evidence_or_run_manifest_across_packages() -> None:
    reads = re.compile(r"""(\.container|\.where|\.evidence|run_manifest)(\.get\(|\[)""")
    offenders = [f"{p}:{n}" for p in sorted((ROOT / "builder").rglob("*.py")) if "builder/gating/" not in str(p)
                 for n, line in enumerate(p.read_text().splitlines(), 1) if reads.search(line)]
    assert offenders == []


def test_sqsh_dir_for_a_docker_accepted_report_is_refused(report_inputs: Any, tmp_path: Path) -> None:
    from builder.pipeline import releasing
    from builder.report import document

    pins, sources, build, acceptance = report_inputs(repository="127.0.0.1:5000/tests/sqsh-dir")
    paths = document.write(document.make_report(pins, lock_record.of(pins), sources, build, acceptance), tmp_path)
    before = paths["json"].read_bytes()
    with pytest.raises(BadInput, match=r"^--sqsh-dir: .* accepted by Docker gates"):
        releasing.publish_report(paths["json"], Settings.from_env(), sqsh_dir=tmp_path / "elsewhere")
    assert paths["json"].read_bytes() == before


def test_a_two_node_gate_step_under_pyxis_is_one_srun_line_of_documented_flags() -> None:
    """The whole srun line of a two-node gate step with runtime enroot (SlurmRunner.step_argv, no cluster): one
    task per node, the step's reserved port, pyxis' --container-* flags (the data mount read-only), the site's srun
    flags, then the in-image gate. Only the line is checked: pyxis and enroot were never executed here."""
    from builder.core.constants import CACHE_DIR, CACHE_ENV
    from builder.core.records import SqshFacts
    from builder.runners.slurm_runner import SCRATCH_CACHE, SlurmRunner

    pins = _pins(runtime="enroot", shared_dir="/shared", partition="gates", srun_args=["--constraint=a100"])
    pins = pins.model_copy(update={"acceptance": pins.acceptance.model_copy(update={
        "nodes": 2, "mounts": [model.Mount(source="/models/m", target="/data/model")]})})
    made = plan.make(pins, plan.Flags(slurm=True, gates=["zero_update"], timeout_s=600), Settings.from_env()).acceptance
    runner = SlurmRunner(pins, made, SqshFacts(path="/shared/img.sqsh", sha256="ab" * 32), run_id="r1")
    runner.job = "4242"
    argv, spec = runner.step_argv("zero_update", "zero_update-1", "/shared/.runs/r1/zero_update-1", 600)
    exports = ",".join(f"{k}={v.replace(CACHE_DIR, SCRATCH_CACHE, 1)}" for k, v in sorted(CACHE_ENV.items()))
    assert ["srun", *argv] == [
        "srun", "--jobid=4242", "-N2", "-n2", "--ntasks-per-node=1", "--job-name=zero_update-1", "--time=10",
        "--kill-on-bad-exit=1", "--output=/shared/.runs/r1/zero_update-1-%t.out",
        "--error=/shared/.runs/r1/zero_update-1-%t.err", "--resv-ports=1",
        "--container-image=/shared/img.sqsh",
        "--container-mounts=/shared/.runs/r1/zero_update-1/$SLURM_PROCID:/tmp/acceptance:rw+rprivate,"
        "/models/m:/data/model:ro",
        "--no-container-mount-home", "--container-readonly", "--container-workdir=/tmp",
        f"--export=NONE,{exports},DEMO_BATCH_INVARIANT", "--constraint=a100",
        "/opt/venv/bin/python", "-m", "acceptance", "gate", "zero_update", "--settings", "@/tmp/acceptance/settings.json"]
    assert argv[-len(spec.command):] == spec.command  # the task is the gate itself: no shell, no ch-run
    assert runner.describe().isolation["executed"].startswith("no: not executed here")
    one_node = _pins(runtime="enroot", shared_dir="/shared")
    one = plan.make(one_node, plan.Flags(slurm=True, gates=["zero_update"]), Settings.from_env()).acceptance
    single = SlurmRunner(one_node, one, SqshFacts(path="/shared/img.sqsh", sha256="ab" * 32), run_id="r1")
    single.job = "4242"
    line = single.step_argv("zero_update", "zero_update-1", "/shared/.runs/r1/zero_update-1", 600)[0]
    assert line[1:4] == ["-N1", "-n1", "--ntasks-per-node=1"] and "--resv-ports=1" not in line


def test_the_slurm_runner_writes_the_settings_with_its_cache_layout_and_jit_cache() -> None:
    """What each rank's settings.json holds: the gate's wire with the cluster's cache directory, the node layout
    (hosts, the rollout rank's address) and the node-local JIT cache: the keys and values the in-image suite read
    when the runner added them to the dict itself."""
    from builder.core.records import SqshFacts
    from builder.gating.settings import GateCall, GateSettings
    from builder.runners import nodecheck
    from builder.runners.slurm_runner import SCRATCH_CACHE, SlurmRunner

    pins = _pins(shared_dir="/shared", node_local_dir="/local/%n")
    pins = pins.model_copy(update={"acceptance": pins.acceptance.model_copy(update={"nodes": 2})})
    made = plan.make(pins, plan.Flags(slurm=True, gates=["zero_update"]), Settings.from_env()).acceptance
    runner = SlurmRunner(pins, made, SqshFacts(path="/shared/img.sqsh", sha256="ab" * 32), run_id="r1")
    runner.nodes = [nodecheck.Node("n1", {"address": "10.0.0.1"}), nodecheck.Node("n2", {"address": "10.0.0.2"})]
    typed = GateSettings.of(pins)
    wire = GateCall("zero_update", typed).wire(runner._placement())
    added: dict[str, Any] = {"cache_dir": SCRATCH_CACHE,
                             "layout": {"nodes": 2, "hosts": ["n1", "n2"], "rollout_host": "10.0.0.2"},
                             "jit_cache": {"dir": SCRATCH_CACHE, "key": runner.jit_key(), "node_local": True,
                                           "isolation": "image sha256, components' commits, GPU architecture, rank"}}
    assert wire == {**typed.wire("zero_update"), **added}
    assert runner.describe().layout == wire["layout"]
    shared = SlurmRunner(_pins(shared_dir="/shared"), plan.make(_pins(shared_dir="/shared"), plan.Flags(
        slurm=True, gates=["zero_update"]), Settings.from_env()).acceptance, runner.sqsh, run_id="r2")
    assert GateCall("zero_update", typed).wire(shared._placement()) == {  # no node-local disk: no JIT cache
        **typed.wire("zero_update"), "cache_dir": SCRATCH_CACHE, "layout": {"nodes": 1}}


def test_a_rank_that_failed_or_ran_another_image_fails_the_gate_and_only_a_named_link_is_inconclusive() -> None:
    from builder.core.records import Evidence, GateResult
    from builder.runners import nodecheck
    from builder.runners.slurm_runner import _merge_roles

    nodes = [nodecheck.Node("n1"), nodecheck.Node("n2")]
    census = {"image": "sha256:aa", "nodes": {"n1": {"seen": [1], "recorded": [1], "unrecorded": []}}}
    good = GateResult(name="zero_update", status="pass", reason="diff 0",
                      evidence=Evidence.model_validate({"census": census, "steps": {"1": {"diff_max": 0.0}}}))
    peer = {"role": "rollout", "status": "pass", "reason": "served",
            "evidence": {"census": {"image": "sha256:aa", "nodes": {"n2": {"seen": [2], "recorded": [2]}}}}}
    merged = _merge_roles(good, [peer], nodes)
    seen = merged.evidence.census
    assert merged.status == "pass" and isinstance(seen, dict) and set(seen.get("nodes") or {}) == {"n1", "n2"}
    other = {**peer, "evidence": {"census": {"image": "sha256:bb", "nodes": {}}}}
    assert _merge_roles(good, [other], nodes).reason.startswith("node n2 (rank 1) runs image sha256:bb")
    assert _merge_roles(good, [None], nodes).reason.startswith("node n2 (rank 1): the rollout role printed no result")
    layout = {"run": {"layout": {"address": "127.0.0.1:12001"}}, "steps": {"1": {}, "2": {}}}
    crash = GateResult(name="zero_update", status="fail", reason="recipe exited with status 1; ImportError: x",
                       evidence=Evidence.model_validate(layout))
    assert _merge_roles(crash, [None], nodes).status == "fail"  # no step, no peer, but the link is not named
    refused = crash.model_copy(update={"reason": "rollout server 127.0.0.1:12001: not reachable"})
    link = _merge_roles(refused, [None], nodes)
    assert link.status == "inconclusive" and link.reason.startswith(
        "the link between ranks failed: the trainer on n1 never reached the rollout rank on n2 at 127.0.0.1:12001")


def test_the_node_local_jit_cache_is_keyed_by_image_commits_arch_and_rank() -> None:
    """The JIT cache path names the image (.sqsh sha256), the components' commits (any one moved: another key), the
    node's GPU architecture and the rank; tests/integration/test_cluster_nodes.py shows the isolation on the cluster."""
    from builder.core.records import SqshFacts
    from builder.runners.slurm_runner import SlurmRunner

    pins = _pins(shared_dir="/shared", node_local_dir="/local/%n")
    made = plan.make(pins, plan.Flags(slurm=True, gates=["zero_update"]), Settings.from_env()).acceptance
    image = SqshFacts(path="/shared/img.sqsh", sha256="ab" * 32)
    moved = pins.model_copy(update={"components": pins.components.model_copy(update={
        "verl": pins.components["verl"].model_copy(update={"commit": "0" * 40})})})
    keys = [SlurmRunner(p, made, image, run_id="r1").jit_key() for p in (pins, moved)]
    other_image = SlurmRunner(pins, made, SqshFacts(path="/shared/b.sqsh", sha256="cd" * 32), run_id="r1").jit_key()
    assert len({*keys, other_image}) == 3 and keys[0].startswith("ab" * 8)
    path = SlurmRunner(pins, made, image, run_id="r1")._jit_dir()
    assert path is not None and path.startswith(f"/local/$SLURMD_NODENAME/jit/{keys[0]}-$(cat ")
    assert path.endswith("/rank$SLURM_PROCID") and "arch-$SLURMD_NODENAME" in path
