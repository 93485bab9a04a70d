"""The cluster leg without a cluster: the runtimes' command lines (enroot/pyxis is only ever checked here,
never executed), the acceptance.slurm pins section and the --slurm flags, checked by the same rules."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builder.cluster import accept as cluster_accept
from builder.cluster import runtimes
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.lock import record as lock_record
from builder.nightly import fleet
from builder.pins import model

ROOT = Path(__file__).resolve().parents[2]
SPEC = runtimes.GateSpec(sqsh="/shared/img.sqsh", out_dir="/shared/.runs/r/provenance-1",
                         env_file="/shared/.runs/r/environment-n1", env={"HOME": "/tmp/cache"},
                         command=["/opt/venv/bin/python", "-m", "acceptance", "gate", "provenance"])


def test_charliecloud_runs_the_sqsh_read_only_with_the_image_environment_and_one_bind() -> None:
    argv = runtimes.Charliecloud().argv(SPEC)
    assert argv[0] == "ch-run" and "--unset-env=*" in argv and "--set-env=/shared/.runs/r/environment-n1" in argv
    assert [a for a in argv if a.startswith("--bind")] == ["--bind=/shared/.runs/r/provenance-1:/tmp/acceptance"]
    assert "--private-tmp" in argv and "--home" not in argv and "-w" not in argv and "--write" not in argv
    assert argv[argv.index("--") - 1] == "/shared/img.sqsh" and argv[argv.index("--") + 1:] == SPEC.command
    assert runtimes.Charliecloud().srun_args(SPEC) == []
    assert runtimes.Charliecloud().isolation()["network"].startswith("host:")


def test_enroot_uses_pyxis_documented_flags_only() -> None:
    args = runtimes.Enroot().srun_args(SPEC)
    assert args == ["--container-image=/shared/img.sqsh",
                    "--container-mounts=/shared/.runs/r/provenance-1:/tmp/acceptance:rw+rprivate",
                    "--no-container-mount-home", "--container-readonly", "--container-workdir=/tmp",
                    "--export=NONE,HOME=/tmp/cache"]
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


def test_flags_override_the_pins_and_are_checked_like_them(tmp_path: Path) -> None:
    pins = _pins(partition="gates", srun_args=["--constraint=a100"], time_limit_s=900)
    opts = cluster_accept.options(pins, Settings.from_env(), {"partition": "big", "shared_dir": str(tmp_path)})
    assert opts.partition == "big" and opts.srun_args == ["--constraint=a100"] and opts.time_limit_s == 900
    assert opts.shared_dir == tmp_path and opts.runtime == "charliecloud"
    with pytest.raises(BadInput, match=r"^--slurm-qos: expected a Slurm"):
        cluster_accept.options(pins, Settings.from_env(), {"qos": "high$(x)"})


def test_a_fleet_passes_the_slurm_flags_to_each_run() -> None:
    flags = {"partition": "gates", "account": None, "qos": None, "time_limit_s": 600,
             "shared_dir": "/shared/images", "runtime": None}
    assert fleet.slurm_argv(flags) == ["--slurm", "--slurm-partition", "gates", "--slurm-time-limit", "600",
                                       "--slurm-shared-dir", "/shared/images"]
    assert fleet.slurm_argv(None) == []


def test_nightly_slurm_flag_without_slurm_is_refused(tmp_path: Path) -> None:
    from builder.cli import run

    assert run(["nightly", str(ROOT / "pins" / "demo.yaml"), "--slurm-partition", "gates"]) == 2


def test_sqsh_dir_for_a_docker_accepted_report_is_refused(report_inputs: Any, tmp_path: Path) -> None:
    from builder import pipeline
    from builder.report import document

    pins, sources, build, acceptance = report_inputs(repository="127.0.0.1:5000/tests/sqsh-dir")
    paths = document.write(document.make_report(pins, lock_record.of(pins), sources, build, acceptance), tmp_path)
    before = paths["json"].read_bytes()
    with pytest.raises(BadInput, match=r"^--sqsh-dir: .* accepted by Docker gates"):
        pipeline.publish_report(paths["json"], Settings.from_env(), sqsh_dir=tmp_path / "elsewhere")
    assert paths["json"].read_bytes() == before
