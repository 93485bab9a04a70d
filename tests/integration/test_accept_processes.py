"""Per-process provenance against REAL demo images: the recipe's main process and its rollout worker
(forked: its argv is the trainer's) each record themselves through the image's start-up hook; the clean stack passes and
is listed in the report, and the two worker defects (tinyrl PRs #37, #38) fail naming the worker and the path."""
from typing import Any

import pytest

from builder.accept import gates as accept
from builder.core.options import Settings
from builder.lock import record as lock_record
from builder.report import document

SETTINGS = Settings.from_env()
SITE = "/opt/venv/lib/python3.11/site-packages"

pytestmark = pytest.mark.docker


def _roles(processes: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    main = next(p for p in processes if "tinyrl.main_ppo" in " ".join(p["argv"]) and not p["forked"])
    worker = next(p for p in processes if p["name"] == "RolloutWorker")
    return main, worker


def test_clean_stack_records_main_and_worker_and_the_report_lists_them(demo_image: Any, docker_client: Any,
                                                                         run_id: str) -> None:
    pins, resolved, _, built = demo_image
    result = accept.accept(built.image_id, pins, SETTINGS, gates=["rl_step"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "rl_step")
    assert gate.status == "pass", gate.reason
    assert gate.evidence["process_failures"] == []
    main, worker = _roles(gate.evidence["processes"])
    assert worker["ppid"] == main["pid"] and worker["forked"] and worker["argv"] == main["argv"]
    assert worker["mnt_ns"] == main["mnt_ns"] and all(p["complete"] for p in (main, worker))
    assert worker["modules"]["tinyengine"] == f"{SITE}/tinyengine/__init__.py"
    assert worker["modules"]["tinyengine._C"].startswith(f"{SITE}/tinyengine/_C.")
    assert "tinyengine" not in main["modules"] and main["modules"]["tinyrl.main_ppo"] == f"{SITE}/tinyrl/main_ppo.py"
    report = document.make_report(pins, lock_record.of(pins), resolved, built, result)
    listed = report.processes["rl_step"]
    assert {p["pid"] for p in listed} == {p["pid"] for p in gate.evidence["processes"]} and len(listed) >= 2
    markdown = document.to_markdown(report)
    assert "### Processes per gate" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith(f"| rl_step | {worker['pid']} |"))
    assert f"| {main['pid']} | RolloutWorker |" in row and "| complete | pass |" in row, row
    print("\n".join(line for line in markdown.splitlines() if line.startswith("| rl_step |")))


def test_worker_with_an_engine_overlay_fails_naming_the_worker(demo_image: Any, build_variant: Any,
                                                               docker_client: Any, run_id: str) -> None:
    pins = demo_image[0]
    result = accept.accept(build_variant("verl", 37).image_id, pins, SETTINGS, gates=["zero_update"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "zero_update")
    assert gate.status == "fail"
    main, worker = _roles(gate.evidence["processes"])
    assert main["status"] == "pass" and worker["status"] == "fail"  # the trainer process stays clean
    head = f"per-process provenance: process {worker['pid']} RolloutWorker ({' '.join(worker['argv'])[:60]}"
    assert gate.reason.startswith(head), gate.reason
    print(gate.reason)
    assert "tinyengine imported from /tmp/runtime_env_" in gate.reason and "/tinyengine/__init__.py, outside " \
        f"site-packages {SITE}" in gate.reason, gate.reason


def test_worker_loading_another_native_build_fails_naming_the_worker(demo_image: Any, build_variant: Any,
                                                                     docker_client: Any, run_id: str) -> None:
    pins = demo_image[0]
    result = accept.accept(build_variant("verl", 38).image_id, pins, SETTINGS, gates=["rl_step"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "rl_step")
    assert gate.status == "fail"
    main, worker = _roles(gate.evidence["processes"])
    assert main["status"] == "pass" and worker["status"] == "fail"
    assert gate.reason.startswith(f"per-process provenance: process {worker['pid']} RolloutWorker ("), gate.reason
    failures = " | ".join(gate.evidence["process_failures"])
    print(gate.reason, *gate.evidence["process_failures"], sep="\n")
    assert "another build of vllm's _C.cpython-311-x86_64-linux-gnu.so loaded from /tmp/tinyrl_ext_" in failures
    assert "tinyengine._C imported from /tmp/tinyrl_ext_" in failures, failures
