"""Unit tests of the in-image acceptance code on real log text.

tests/data/acceptance/<run>.{jsonl,console,rc} were recorded from real runs of the demo stack's
`python -m tinyrl.main_ppo` on the host (2 steps, seed 1, batch 8 x 4); see the README there.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from acceptance import checkpoint, decide, metrics, procfs, recipe
from acceptance.__main__ import plain
from acceptance.defaults import METRICS as DEFAULT_METRICS

DATA = Path(__file__).resolve().parents[1] / "data" / "acceptance"
ROOT = Path(__file__).resolve().parents[2]
METRICS = {**DEFAULT_METRICS, "throughput": "perf/rollout_tokens_per_s"}
CHECKSUMS = (METRICS["weights_before"], METRICS["weights_after"])


def load(name: str, exit_code: int | None = None, drop: tuple[str, ...] = (), last_step: int | None = None,
         console: bool = True, jsonl: bool = True) -> decide.Run:
    """A Run parsed from a recorded run, optionally with keys dropped or steps cut (to plant a gap)."""
    file_text = (DATA / f"{name}.jsonl").read_text() if jsonl else ""
    console_text = (DATA / f"{name}.console").read_text() if console else ""
    file_steps, problems = metrics.parse_jsonl(file_text)
    console_steps = metrics.parse_console(console_text)
    for steps in (file_steps, console_steps):
        for step in list(steps):
            if last_step is not None and step > last_step:
                del steps[step]
                continue
            for key in drop:
                steps[step].pop(key, None)
    steps, source = metrics.merged(file_steps, console_steps)
    code = int((DATA / f"{name}.rc").read_text()) if exit_code is None else exit_code
    return decide.Run(exit_code=code, steps=steps, source=source, console=console_steps, problems=problems)


# ---- parsing


def test_jsonl_and_console_agree_on_a_real_run() -> None:
    file_steps, problems = metrics.parse_jsonl((DATA / "clean_rl.jsonl").read_text())
    console_steps = metrics.parse_console((DATA / "clean_rl.console").read_text())
    assert problems == []
    assert sorted(file_steps) == sorted(console_steps) == [1, 2]
    for step in (1, 2):
        for key, value in file_steps[step].items():
            assert console_steps[step][key] == value, (step, key)


def test_nan_is_parsed_as_nan_from_both_logs() -> None:
    file_steps, _ = metrics.parse_jsonl((DATA / "nan_zero.jsonl").read_text())
    console_steps = metrics.parse_console((DATA / "nan_zero.console").read_text())
    for steps in (file_steps, console_steps):
        diff = metrics.number(steps[1][METRICS["diff_max"]])
        assert diff is not None and math.isnan(diff)


def test_console_lines_with_a_worker_prefix() -> None:
    line = "(TaskRunner pid=42) step:3 - training/rollout_probs_diff_max:0.0 - actor/weights_checksum_after:00ff"
    assert metrics.parse_console(line + "\nnot a step line\n") == {
        3: {"training/rollout_probs_diff_max": 0.0, "actor/weights_checksum_after": "00ff"}}


def test_bad_jsonl_lines_are_reported_not_used() -> None:
    steps, problems = metrics.parse_jsonl('{"step": 1, "data": {"a": 0.0}}\nnot json\n{"data": {}}\n')
    assert steps == {1: {"a": 0.0}}
    assert len(problems) == 2


# ---- zero_update


def test_zero_update_passes_on_exact_zero() -> None:
    status, reason, evidence = decide.zero_update(load("clean_zero"), 2, METRICS)
    assert status == "pass", reason
    assert len(evidence["weights"]) == 1


def test_zero_update_fails_on_nan() -> None:
    status, reason, _ = decide.zero_update(load("nan_zero"), 2, METRICS)
    assert status == "fail"
    assert "not a number" in reason and METRICS["diff_max"] in reason


def test_zero_update_fails_on_missing_metric() -> None:
    status, reason, _ = decide.zero_update(load("nok3_zero"), 2, METRICS)
    assert status == "fail"
    assert METRICS["k3_kl"] in reason and "missing" in reason


def test_zero_update_fails_on_missing_step() -> None:
    status, reason, _ = decide.zero_update(load("clean_zero", last_step=1), 2, METRICS)
    assert status == "fail"
    assert "[2] missing" in reason


def test_zero_update_fails_on_nonzero_exit() -> None:
    status, reason, _ = decide.zero_update(load("clean_zero", exit_code=1), 2, METRICS)
    assert status == "fail"
    assert "status 1" in reason


def test_zero_update_without_checksums_is_inconclusive() -> None:
    status, reason, _ = decide.zero_update(load("clean_zero", drop=CHECKSUMS), 2, METRICS)
    assert status == "inconclusive"
    assert "not logged" in reason


def test_zero_update_fails_when_only_some_checksums_are_logged() -> None:
    status, reason, _ = decide.zero_update(load("clean_zero", drop=CHECKSUMS[1:]), 2, METRICS)
    assert status == "fail"
    assert "checksum missing" in reason


def test_zero_update_fails_without_batch_invariance() -> None:
    status, reason, _ = decide.zero_update(load("bi_broken_zero"), 2, METRICS)
    assert status == "fail"
    assert "expected exactly 0.0" in reason


def test_zero_update_fails_when_weights_move_at_lr_zero() -> None:
    status, reason, evidence = decide.zero_update(load("decay_zero"), 2, METRICS)
    assert status == "fail"
    assert "weights changed with lr 0" in reason
    assert len(evidence["weights"]) > 1


def test_zero_update_falls_back_to_console_lines() -> None:
    run = load("clean_zero", jsonl=False)
    assert run.source == "console"
    status, reason, _ = decide.zero_update(run, 2, METRICS)
    assert status == "pass", reason


def test_zero_update_fails_when_console_contradicts_file() -> None:
    run = load("clean_zero")
    run.console[2][METRICS["diff_max"]] = 0.25
    status, reason, _ = decide.zero_update(run, 2, METRICS)
    assert status == "fail"
    assert "disagree" in reason


def test_zero_update_fails_on_empty_log() -> None:
    status, reason, _ = decide.zero_update(decide.Run(exit_code=0, steps={}, source="none"), 2, METRICS)
    assert status == "fail"
    assert "no step metrics" in reason


# ---- rl_step


def test_rl_step_passes_after_update_and_reload() -> None:
    status, reason, evidence = decide.rl_step(load("clean_rl"), 2, METRICS)
    assert status == "pass", reason
    assert evidence["throughput"] > 0


def test_rl_step_fails_when_engine_skips_weight_reload() -> None:
    assert decide.zero_update(load("noreload_zero"), 2, METRICS)[0] == "pass"
    status, reason, _ = decide.rl_step(load("noreload_rl"), 2, METRICS)
    assert status == "fail"
    assert reason.startswith("step 2:")


def test_rl_step_fails_when_weights_do_not_change() -> None:
    status, reason, _ = decide.rl_step(load("clean_zero"), 2, METRICS)
    assert status == "fail"
    assert "did not change" in reason


def test_rl_step_fails_on_nonfinite_loss() -> None:
    run = load("clean_rl")
    run.steps[2][METRICS["loss"]] = float("inf")
    status, reason, _ = decide.rl_step(run, 2, METRICS)
    assert status == "fail"
    assert METRICS["loss"] in reason


def test_rl_step_without_checksums_is_inconclusive() -> None:
    status, _, _ = decide.rl_step(load("clean_rl", drop=CHECKSUMS), 2, METRICS)
    assert status == "inconclusive"


# ---- control


def test_control_passes_on_a_real_mismatch() -> None:
    status, reason, evidence = decide.control(load("clean_control"), 2, METRICS)
    assert status == "pass", reason
    assert evidence["diff_max"] > 0


def test_control_all_zero_is_inconclusive() -> None:
    status, reason, _ = decide.control(load("clean_rl"), 2, METRICS)
    assert status == "inconclusive"
    assert "cannot tell" in reason


def test_control_fails_on_nan_and_missing_metric_and_crash() -> None:
    assert decide.control(load("nan_zero"), 2, METRICS)[0] == "fail"
    assert decide.control(load("nok3_zero"), 2, METRICS)[0] == "fail"
    assert decide.control(load("clean_control", exit_code=1), 2, METRICS)[0] == "fail"


# ---- recipe command


def test_command_sets_steps_lr_and_logger() -> None:
    settings = {"entry": ["python3", "-m", "verl.trainer.main_ppo"], "steps": 2,
                "steps_key": "trainer.total_training_steps", "lr_key": "actor_rollout_ref.actor.optim.lr",
                "overrides": {"actor_rollout_ref.actor.optim.lr": 1e-6, "actor_rollout_ref.rollout.name": "vllm",
                              "actor_rollout_ref.rollout.calculate_log_probs": True}}
    argv, env = recipe.command(settings, 0.0, "/tmp/x.jsonl")
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert "actor_rollout_ref.actor.optim.lr=0.0" in argv
    assert "actor_rollout_ref.rollout.calculate_log_probs=true" in argv
    assert "trainer.total_training_steps=2" in argv and "trainer.logger=[console,file]" in argv
    assert env == {"VERL_FILE_LOGGER_PATH": "/tmp/x.jsonl"}
    assert recipe.arm({"aligned_env": {"A": "1"}, "control_env": {"A": "0"}, "lr": 0.5}, "control") == ({"A": "0"}, 0.5)


def test_result_line_is_strict_json() -> None:
    line = json.dumps(plain({"evidence": {"x": float("nan"), "y": [float("inf"), 1.0]}}), allow_nan=False)
    assert json.loads(line) == {"evidence": {"x": "nan", "y": ["inf", 1.0]}}


# ---- procfs


def test_mountinfo_parsing_and_cover() -> None:
    text = ("36 35 98:0 /mnt1 /opt/venv/lib/python3.11/site-packages/tinyengine ro,relatime master:1 - ext4 /dev/x rw\n"
            "37 35 0:50 / /with\\040space rw - tmpfs tmpfs rw\n")
    table = procfs.mounts(text)
    assert table[0]["mount_point"].endswith("/tinyengine") and table[0]["root"] == "/mnt1"
    assert table[1]["mount_point"] == "/with space"
    site = "/opt/venv/lib/python3.11/site-packages"
    assert procfs.covers(table[0]["mount_point"], site + "/tinyengine/engine.py")
    assert not procfs.covers(table[0]["mount_point"], site + "/tinyengine2/x.py")
    assert procfs.covers("/", "/anything")


# ---- provenance on the host, against a manifest of a package installed in a temp site-packages


def _fake_install(tmp_path: Path) -> tuple[Path, dict[str, Any], Path]:
    site = tmp_path / "site"
    pkg, info = site / "accdemo", site / "accdemo-1.0.dist-info"
    pkg.mkdir(parents=True)
    info.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '1.0'\n")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: accdemo\nVersion: 1.0\n")
    (info / "BUILDER_PROVENANCE.json").write_text(json.dumps({"commit": "a" * 40}))
    (info / "RECORD").write_text("accdemo/__init__.py,,\naccdemo-1.0.dist-info/METADATA,,\n"
                                 "accdemo-1.0.dist-info/BUILDER_PROVENANCE.json,,\naccdemo-1.0.dist-info/RECORD,,\n")
    files = {str(p): procfs.sha256(str(p)) for p in (pkg / "__init__.py", info / "METADATA",
                                                     info / "BUILDER_PROVENANCE.json", info / "RECORD")}
    manifest = {"schema": 1, "python": sys.executable, "site_packages": str(site),
                "components": {"verl": {"distribution": "accdemo", "version": "1.0", "commit": "a" * 40,
                                        "modules": ["accdemo"], "files": files, "native_libs": {}}}}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    _record_startup_hooks(tmp_path, site, path)
    return site, json.loads(path.read_text()), path


def _gate_env(tmp_path: Path, site: Path) -> dict[str, Any]:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "PYTHONPATH": f"{ROOT}:{site}"}


def _record_startup_hooks(tmp_path: Path, site: Path, manifest_path: Path) -> None:
    """What write_manifest.py does at build time: the start-up hooks this interpreter sees."""
    code = "import json, sys; from acceptance import procfs; print(json.dumps(procfs.startup_hooks(sys.path)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=_gate_env(tmp_path, site), cwd=tmp_path, timeout=60)
    manifest = json.loads(manifest_path.read_text())
    manifest["startup_hooks"] = json.loads(out.stdout)
    manifest_path.write_text(json.dumps(manifest))


def _provenance(tmp_path: Path, site: Path, manifest_path: Path) -> dict[str, Any]:
    (tmp_path / "cache").mkdir(exist_ok=True)
    settings = {"manifest": str(manifest_path), "cache_dir": str(tmp_path / "cache"), "entry": [sys.executable]}
    out = subprocess.run([sys.executable, "-m", "acceptance", "gate", "provenance", "--settings", json.dumps(settings)],
                         capture_output=True, text=True, env=_gate_env(tmp_path, site), cwd=tmp_path, timeout=120)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_provenance_passes_on_a_matching_install(tmp_path: Path) -> None:
    site, _, manifest_path = _fake_install(tmp_path)
    result = _provenance(tmp_path, site, manifest_path)
    assert result["status"] == "pass", result["reason"]
    mod = result["evidence"]["components"]["verl"]["modules"]["accdemo"]
    assert mod["file"] == str(site / "accdemo" / "__init__.py")


def test_provenance_fails_on_a_pth_added_after_the_build(tmp_path: Path) -> None:
    site, _, manifest_path = _fake_install(tmp_path)
    (site / "zz_patch.pth").write_text("import os\n")
    result = _provenance(tmp_path, site, manifest_path)
    assert result["status"] == "fail"
    assert f"start-up hook {site / 'zz_patch.pth'} is not in the manifest" in result["reason"]


def test_provenance_fails_without_recorded_startup_hooks(tmp_path: Path) -> None:
    site, manifest, manifest_path = _fake_install(tmp_path)
    del manifest["startup_hooks"]
    manifest_path.write_text(json.dumps(manifest))
    result = _provenance(tmp_path, site, manifest_path)
    assert result["status"] == "fail" and "records no startup_hooks" in result["reason"]


def test_provenance_fails_on_an_edited_file(tmp_path: Path) -> None:
    site, _, manifest_path = _fake_install(tmp_path)
    with open(site / "accdemo" / "__init__.py", "a") as fh:
        fh.write("EDITED = True\n")
    result = _provenance(tmp_path, site, manifest_path)
    assert result["status"] == "fail"
    assert "__init__.py sha256" in result["reason"]


def test_provenance_fails_on_an_unlisted_file_and_wrong_commit(tmp_path: Path) -> None:
    site, manifest, manifest_path = _fake_install(tmp_path)
    (site / "accdemo" / "extra.py").write_text("x = 1\n")
    manifest["components"]["verl"]["commit"] = "b" * 40
    manifest_path.write_text(json.dumps(manifest))
    result = _provenance(tmp_path, site, manifest_path)
    assert result["status"] == "fail"
    text = "\n".join(result["evidence"]["failures"])
    assert "extra.py is installed but not in the manifest" in text
    assert "stamped commit" in text


def test_provenance_fails_on_a_non_empty_cache_and_missing_manifest(tmp_path: Path) -> None:
    site, _, manifest_path = _fake_install(tmp_path)
    (tmp_path / "cache" / "inductor").mkdir(parents=True)
    (tmp_path / "cache" / "inductor" / "kernel.so").write_bytes(b"x")
    result = _provenance(tmp_path, site, manifest_path)
    assert result["status"] == "fail"
    assert "not empty at start" in result["reason"]
    missing = _provenance(tmp_path, site, tmp_path / "nope.json")
    assert missing["status"] == "fail" and "missing" in missing["reason"]


# ---- host side: the container spec (no engine needed)


def test_container_spec_is_isolated_and_asks_gpus_only_when_pinned() -> None:
    from builder.gating.settings import GateCall, GateSettings
    from builder.pins import model as pins_mod
    from builder.runners import docker_runner as host

    pins = pins_mod.load(ROOT / "pins" / "demo.yaml")
    spec = host.container_spec(pins, "sha256:" + "ab" * 32, GateCall("rl_step", GateSettings.of(pins)), "r1")
    kwargs = spec.sdk_kwargs()
    assert kwargs["image"].startswith("sha256:") and kwargs["network_mode"] == "none"
    assert kwargs["mounts"] == [] and "device_requests" not in kwargs
    assert set(kwargs["tmpfs"]) == {"/cache", "/tmp"} and "exec" in kwargs["tmpfs"]["/cache"].split(",")
    assert kwargs["environment"]["HOME"] == "/cache" and kwargs["labels"][host.LABEL] == "r1"
    settings = json.loads(spec.command[-1])
    assert spec.command[:5] == [pins.base.python_bin, "-m", "acceptance", "gate", "rl_step"]
    assert settings["lr"] == pins.rl_lr() and settings["metrics"]["diff_max"] == pins.acceptance.metrics.diff_max

    gpu = pins.model_copy(update={"acceptance": pins.acceptance.model_copy(update={
        "gpus": 2, "mounts": [pins_mod.Mount(source="/data", target="/data")]})})
    kwargs = host.container_spec(gpu, "sha256:" + "ab" * 32, GateCall("rl_step", GateSettings.of(gpu)), "r1").sdk_kwargs()
    assert kwargs["device_requests"][0]["Count"] == 2
    assert kwargs["mounts"][0]["ReadOnly"] is True and kwargs["mounts"][0]["Target"] == "/data"


def test_a_gate_result_comes_from_its_last_stdout_line_or_fails_naming_why() -> None:
    from builder.gating.runner import result_from_output

    line = json.dumps({"name": "zero_update", "status": "pass", "reason": "diff 0",
                       "evidence": {"steps": {"1": {"diff_max": 0.0}}}})
    ok = result_from_output("zero_update", 0, "noise\n" + line + "\n", "err", False, 60)
    assert ok.status == "pass" and ok.evidence.steps == {"1": {"diff_max": 0.0}} and ok.log == "err"
    other = result_from_output("zero_update", 0, line.replace("zero_update", "rl_step"), "", False, 60)
    assert other.status == "fail" and "status 0 without a result line" in other.reason
    late = result_from_output("rl_step", None, "", "", True, 60, killed_by="job cancelled")
    assert late.status == "fail" and late.reason == "timed out after 60 s (job cancelled)"


def test_checkpoint_settings_and_the_scratch_mount_come_from_the_pins() -> None:
    from builder.gating.settings import GateCall, GateSettings
    from builder.pins import model as pins_mod

    pins = pins_mod.load(ROOT / "pins" / "nemotron-3.5-lightning.yaml")
    typed = GateSettings.of(pins)
    settings = typed.wire("rl_step")
    assert typed.weights == settings["weights"] == "checkpoint" and typed.checkpoint is not None
    assert typed.checkpoint.overrides == {"trainer.save_freq": 1,
                                          "actor_rollout_ref.actor.checkpoint.save_contents": ["hf_model"]}
    assert typed.checkpoint.model_path == "/models/Nemotron-3.5-Lightning"
    assert settings["checkpoint"] == typed.checkpoint.wire()
    argv, _ = recipe.command(settings, 1e-6, "/tmp/x.jsonl", checkpoint.overrides(settings, "rl_step"))
    assert "trainer.default_local_dir=/scratch/acceptance/rl_step" in argv
    assert "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]" in argv
    from builder.runners.docker_runner import container_spec

    rw = [m for m in container_spec(pins, "sha256:" + "ab" * 32, GateCall("rl_step", typed), "r1").sdk_kwargs()[
        "mounts"] if not m["ReadOnly"]]
    assert [(m["Source"], m["Target"]) for m in rw] == [("/scratch/acceptance", "/scratch/acceptance")]
    demo = pins_mod.load(ROOT / "pins" / "demo.yaml")
    assert GateSettings.of(demo).wire("rl_step")["checkpoint"] is None
