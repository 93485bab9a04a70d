"""Per-process provenance against REAL demo images: the recipe's main process and its rollout worker
(forked: its argv is the trainer's) each record themselves through the image's start-up hook; the clean stack passes and
is listed in the report, and the two worker defects (tinyrl PRs #37, #38) fail naming the worker and the path.
The gate's own census (acceptance/census.py) sees every process of the run: the three escapes (tinyrl PRs #39-#41,
tests/defects.py) fail naming the process, and with acceptance.nodes 2 in one container the rollout server runs in a
process of its own over TCP, seen and recorded, with zero_update still exactly 0."""
from typing import Any

import pytest

from builder.core.options import Settings
from builder.core.records import GateResult
from builder.engine import containers
from builder.lock import record as lock_record
from builder.report import document
from builder.runners import docker_runner
from builder.runners import factory as runners
from tests.defects import (
    CONTENT_ESCAPES,
    ESCAPE_RECORD_DELETED,
    ESCAPE_RENAMED_INTERPRETER,
    ESCAPE_UNREADABLE,
    ESCAPE_WITHOUT_SITE,
    ESCAPE_WITHOUT_VARIABLES,
    ESCAPES_AT_ONCE,
    HELPERS,
    REASONS,
    UNRECORDED,
)

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
    result = runners.gate_local_image(built.image_id, pins, SETTINGS, gates=["rl_step"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "rl_step")
    assert gate.status == "pass", gate.reason
    assert gate.evidence.get("process_failures") == []
    main, worker = _roles(gate.evidence.model_dump(mode="json")["processes"])
    assert worker["ppid"] == main["pid"] and worker["forked"] and worker["argv"] == main["argv"]
    assert worker["mnt_ns"] == main["mnt_ns"] and all(p["complete"] for p in (main, worker))
    assert worker["modules"]["tinyengine"] == f"{SITE}/tinyengine/__init__.py"
    assert worker["modules"]["tinyengine._C"].startswith(f"{SITE}/tinyengine/_C.")
    assert "tinyengine" not in main["modules"] and main["modules"]["tinyrl.main_ppo"] == f"{SITE}/tinyrl/main_ppo.py"
    for proc in (main, worker):  # every mapped native library attributed: torch's by its RECORD, libc to the base
        owners = set(proc["libraries"].values())
        assert None not in owners and any(str(o).startswith("torch ") for o in owners) and "base image" in owners
    report = document.make_report(pins, lock_record.of(pins), resolved, built, result)
    listed = report.processes["rl_step"]
    ran = gate.evidence.model_dump(mode="json")["processes"]
    assert {p["pid"] for p in listed} == {p["pid"] for p in ran} and len(listed) >= 2
    markdown = document.to_markdown(report)
    assert "### Processes per gate" in markdown and "### Native libraries per process" in markdown
    assert f"| rl_step | {worker['pid']} | torch " in markdown  # which of torch's libraries the worker loaded
    torch = next(r for r in report.runtime_libraries if r["distribution"] == "torch")  # the pins name it
    assert torch["source"] == "base image" and torch["installed"]["import_path"] == f"{SITE}/torch"
    assert {x["pid"] for x in torch["loaded"]} == {main["pid"], worker["pid"]} and all(x["sha256"] for x in torch["loaded"])
    cpu = next(x for x in torch["loaded"] if x["path"].endswith("/libtorch_cpu.so"))  # read in the gate's container
    assert "libc10.so" in cpu["needed"] and all(x["cuda_arches"] == [] for x in torch["loaded"]), cpu  # CPU-only torch
    row = next(line for line in markdown.splitlines() if line.startswith("| rl_step |") and f"| {worker['pid']} |" in line)
    assert f"| {main['pid']} | RolloutWorker |" in row and "| complete | pass |" in row, row
    print("\n".join(line for line in markdown.splitlines() if line.startswith("| rl_step |")))


def test_worker_with_an_engine_overlay_fails_naming_the_worker(demo_image: Any, build_variant: Any,
                                                               docker_client: Any, run_id: str) -> None:
    pins = demo_image[0]
    result = runners.gate_local_image(build_variant("verl", 37).image_id, pins, SETTINGS, gates=["zero_update"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "zero_update")
    assert gate.status == "fail"
    main, worker = _roles(gate.evidence.model_dump(mode="json")["processes"])
    assert main["status"] == "pass" and worker["status"] == "fail"  # the trainer process stays clean
    head = f"per-process provenance: process {worker['pid']} RolloutWorker ({' '.join(worker['argv'])[:60]}"
    assert gate.reason.startswith(head), gate.reason
    print(gate.reason)
    assert "tinyengine imported from /tmp/runtime_env_" in gate.reason and "/tinyengine/__init__.py, outside " \
        f"site-packages {SITE}" in gate.reason, gate.reason


def test_worker_loading_another_native_build_fails_naming_the_worker(demo_image: Any, build_variant: Any,
                                                                     docker_client: Any, run_id: str) -> None:
    pins = demo_image[0]
    result = runners.gate_local_image(build_variant("verl", 38).image_id, pins, SETTINGS, gates=["rl_step"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "rl_step")
    assert gate.status == "fail"
    main, worker = _roles(gate.evidence.model_dump(mode="json")["processes"])
    assert main["status"] == "pass" and worker["status"] == "fail"
    assert gate.reason.startswith(f"per-process provenance: process {worker['pid']} RolloutWorker ("), gate.reason
    failures = " | ".join(gate.evidence.process_failures or [])
    print(gate.reason, *gate.evidence.process_failures or [], sep="\n")
    assert "another build of vllm's _C.cpython-311-x86_64-linux-gnu.so loaded from /tmp/tinyrl_ext_" in failures
    assert "tinyengine._C imported from /tmp/tinyrl_ext_" in failures, failures


# ---- the gate's own census


def _census(gate: GateResult) -> tuple[str, dict[str, Any]]:
    """(node, its census entry: seen, recorded, unrecorded, helpers)."""
    census = gate.evidence.model_dump(mode="json").get("census")
    assert isinstance(census, dict) and census["node"] == gate.evidence.node, census
    return census["node"], census["nodes"][census["node"]]


def test_the_accepted_demo_has_every_process_seen_and_recorded(demo_accepted: Any) -> None:
    result = demo_accepted[3]
    for gate in result.gates:
        if gate.name not in ("zero_update", "rl_step", "control"):
            continue
        assert gate.status == "pass", gate.reason
        node, seen = _census(gate)
        pythons = [r for r in seen["seen"] if r["class"] == "python"]
        assert seen["unrecorded"] == [] and len(pythons) >= 2 and all(r["record"] for r in pythons), seen
        assert {r["pid"] for r in pythons} == {p["pid"] for p in gate.evidence.model_dump(mode="json")["processes"]}
        assert all(r["class"] in ("helper", "unread") for r in seen["helpers"])
        census = gate.evidence.model_dump(mode="json")["census"]
        assert census["fanotify"]["state"] == "on" and census["fanotify"]["errors"] == [], census["fanotify"]
        assert any(r["source"] == "poll+fanotify" for r in pythons), pythons  # the trainer's exec: both saw it
        assert census["image"].startswith("sha256:") and all(p["image"] == census["image"]
                                                             for p in gate.evidence.model_dump(mode="json")["processes"])
        print(f"{gate.name} on {node}: {len(seen['seen'])} seen, {len(seen['recorded'])} recorded, "
              f"{census['polls']} polls, census {census['cpu_s']} s CPU ({census['cpu_parts']}) over {census['seconds']} s")


def _escape(gate: GateResult, defect: tuple[str, int]) -> dict[str, Any]:
    """The escape's one failure: the census names its node, pid, executable and argv; the records pass."""
    assert gate.status == "fail"
    node, seen = _census(gate)
    assert len(seen["unrecorded"]) == 1, seen["unrecorded"]
    row: dict[str, Any] = seen["unrecorded"][0]
    head = f"per-process provenance: census: node {node} process {row['pid']} ({row['exe']}: "
    assert gate.reason.startswith(head) and UNRECORDED in gate.reason and REASONS[defect][1] in gate.reason, gate.reason
    ran = gate.evidence.model_dump(mode="json")["processes"]
    assert all(p["status"] == "pass" for p in ran)  # every record that is there passes
    print(gate.reason)
    return row


def test_a_worker_started_without_its_variables_fails_named(demo_image: Any, build_variant: Any, docker_client: Any,
                                                            run_id: str) -> None:
    gate_name = REASONS[ESCAPE_WITHOUT_VARIABLES][0]
    result = runners.gate_local_image(build_variant(*ESCAPE_WITHOUT_VARIABLES).image_id, demo_image[0], SETTINGS,
                                      gates=[gate_name], run_id=run_id)
    row = _escape(next(g for g in result.gates if g.name == gate_name), ESCAPE_WITHOUT_VARIABLES)
    assert row["argv"][1:3] == ["-m", "tinyrl.rollout_server"] and row["class"] == "python"


def test_a_worker_started_with_python_s_fails_named(demo_image: Any, build_variant: Any, docker_client: Any,
                                                    run_id: str) -> None:
    gate_name = REASONS[ESCAPE_WITHOUT_SITE][0]
    result = runners.gate_local_image(build_variant(*ESCAPE_WITHOUT_SITE).image_id, demo_image[0], SETTINGS,
                                      gates=[gate_name], run_id=run_id)
    row = _escape(next(g for g in result.gates if g.name == gate_name), ESCAPE_WITHOUT_SITE)
    assert row["argv"][1:3] == ["-S", "-c"]


def test_a_worker_that_deletes_its_record_fails_named(demo_image: Any, build_variant: Any, docker_client: Any,
                                                      run_id: str) -> None:
    gate_name = REASONS[ESCAPE_RECORD_DELETED][0]
    result = runners.gate_local_image(build_variant(*ESCAPE_RECORD_DELETED).image_id, demo_image[0], SETTINGS,
                                      gates=[gate_name], run_id=run_id)
    gate = next(g for g in result.gates if g.name == gate_name)
    row = _escape(gate, ESCAPE_RECORD_DELETED)
    trainer = next(p for p in gate.evidence.model_dump(mode="json")["processes"] if not p["forked"])
    assert row["ppid"] == trainer["pid"] and row["argv"] == trainer["argv"]  # the forked worker, named by its pid
    assert "; the run itself" not in gate.reason  # the control arm itself differed as it should


@pytest.mark.parametrize("defect", CONTENT_ESCAPES, ids=[f"{c}-{pr}" for c, pr in CONTENT_ESCAPES])
def test_an_escape_by_content_fails_naming_the_process(defect: tuple[str, int], demo_image: Any, build_variant: Any,
                                                       docker_client: Any, run_id: str) -> None:
    """Issue 47's classes 1-2 under Docker: a renamed copy of the interpreter (by its sha256), a server that
    turns PR_SET_DUMPABLE off (unreadable: fail closed, with its uid). Class 3 (a fork handler's record before an
    exec) and class 4 run in tinyrl PR 50, with the loader and a second unreadable process (the next test)."""
    gate_name, words = REASONS[defect]
    result = runners.gate_local_image(build_variant(*defect).image_id, demo_image[0], SETTINGS, gates=[gate_name], run_id=run_id)
    gate = next(g for g in result.gates if g.name == gate_name)
    assert gate.status == "fail" and words in gate.reason, gate.reason
    node, seen = _census(gate)
    assert len(seen["unrecorded"]) == 1, seen["unrecorded"]
    row: dict[str, Any] = seen["unrecorded"][0]
    assert gate.reason.startswith(f"per-process provenance: census: node {node} process {row['pid']} ("), gate.reason
    if defect == ESCAPE_RENAMED_INTERPRETER:
        assert row["class"] == "python" and row["why"] == "identity" and row["exe"].endswith("/rollout-engine"), row
        assert "fanotify" in row["source"], row  # /tmp is a mount of its own: the census container marks it too
    elif defect == ESCAPE_UNREADABLE:
        assert row["class"] == "unreadable" and f"(uid {row['uid']}: " in gate.reason, row
    print(gate.reason)


def helpers_named(census: dict[str, Any], node: str, failures: list[str], may_read: tuple[str, ...] = ()) -> None:
    """tinyrl PR 50's four helpers (tests/defects.py HELPERS), each unrecorded on `node` in its class, and each
    named in a failure line by node, pid and its role: nothing else unrecorded. `may_read`: roles that fail closed
    only when the census cannot read them (the non-dumpable key holder, where the gate may hold CAP_SYS_PTRACE); one
    it read must be seen with its record, readable, and in no failure line."""
    rows = census["nodes"][node]["unrecorded"]
    by_role = {next((a for a in r["argv"] or [] if a in HELPERS), None): r for r in rows}
    read = {role for role in may_read if role not in by_role}
    assert set(by_role) == set(HELPERS) - read, rows
    for role in read:
        row = next(r for r in census["nodes"][node]["seen"] if role in (r["argv"] or []))
        assert row["record"] and not row["unreadable"] and row["class"] == "python", row
        assert not any(f"process {row['pid']} (" in f for f in failures), failures
        print(f"{role}: process {row['pid']} read by the census and recorded: accounted")
    for role, (kind, why, words) in ((r, h) for r, h in HELPERS.items() if r not in read):
        row = by_role[role]
        assert row["class"] == kind and (why is None or row["why"] == why), row
        line = next((f for f in failures if f"node {node} process {row['pid']} (" in f), "")
        assert words in line and role in line, (role, line, failures)
        print(line)
    assert by_role["tokenizer-warmup"]["exe"].endswith("/ld-linux-x86-64.so.2"), by_role["tokenizer-warmup"]
    assert by_role["session-daemon"]["record"] and by_role["probe"]["record"] is None


def test_four_escapes_at_once_each_fail_named(demo_image: Any, build_variant: Any, docker_client: Any,
                                              run_id: str) -> None:
    """tinyrl PR 50 under Docker: beside the engine, the base interpreter through the dynamic loader (class 1), a
    process that turns PR_SET_DUMPABLE off (class 2), a preexec_fn child that execs python -S after the fork
    handler's record (class 3) and a 40 ms probe that imports tinyrl (class 4, past the floor): one gate names all
    four (test_cluster_escapes.py: the same PR under --slurm, on the rollout node)."""
    gate_name, words = REASONS[ESCAPES_AT_ONCE]
    result = runners.gate_local_image(build_variant(*ESCAPES_AT_ONCE).image_id, demo_image[0], SETTINGS,
                                      gates=[gate_name], run_id=run_id)
    gate = next(g for g in result.gates if g.name == gate_name)
    assert gate.status == "fail" and gate.reason.startswith(words) and "(+3 more)" in gate.reason, gate.reason
    node, _ = _census(gate)
    helpers_named(gate.evidence.model_dump(mode="json")["census"], node, gate.evidence.process_failures or [])


def test_two_nodes_in_one_container_give_the_same_bits(demo_image: Any, demo_accepted: Any, docker_client: Any,
                                                     run_id: str) -> None:
    """acceptance.nodes 2 without a runner that spans nodes: the gate starts the rollout server itself on loopback;
    the trainer reaches it over TCP; the census sees both and both recorded themselves. zero_update and rl_step stay
    exactly 0 and every step's numbers equal the forked worker's (the session's accepted demo); control still differs."""
    pins = demo_image[0]
    two = pins.model_copy(update={"acceptance": pins.acceptance.model_copy(update={"nodes": 2})})
    result = runners.gate_local_image(demo_image[3].image_id, two, SETTINGS, gates=["zero_update", "rl_step", "control"],
                                      run_id=run_id)
    one = {g.name: g for g in demo_accepted[3].gates}
    for gate in (g for g in result.gates if g.status != "not_run"):
        assert gate.status == "pass", gate.reason
        table = gate.evidence.model_dump(mode="json")["steps"]
        steps = {n: {k: v for k, v in s.items() if k != "throughput"} for n, s in table.items()}
        assert steps == {n: {k: v for k, v in s.items() if k != "throughput"}
                         for n, s in one[gate.name].evidence.model_dump(mode="json")["steps"].items()}, gate.name
        assert all((s["diff_max"] > 0) == (gate.name == "control") for s in steps.values()), steps
        layout = gate.evidence.model_dump(mode="json")["run"]["layout"]
        assert layout["nodes"] == 2 and layout["mode"] == "one container (loopback)"
        assert layout["rollout"]["exit_code"] == 0
        node, seen = _census(gate)
        server = next(r for r in seen["seen"] if r["argv"][1:3] == ["-m", "tinyrl.rollout_server"])
        trainer = next(r for r in seen["seen"] if r["argv"][1:3] == ["-m", "tinyrl.main_ppo"])
        assert server["record"] and trainer["record"] and server["pid"] != trainer["pid"] and seen["unrecorded"] == []
        assert f"actor_rollout_ref.rollout.address={layout['address']}" in trainer["argv"]
        assert server["argv"][-4:] == ["--host", "127.0.0.1", "--port", layout["address"].rsplit(":", 1)[1]]
        print(f"{gate.name} over TCP: server {server['pid']}, trainer {trainer['pid']} on {node}; step 2 "
              f"{steps['2']}")


SHORT_ESCAPE = ("verl", 51)  # tinyrl PR 51: ten `python -S -I -c "import tinyrl"` probes, below the poll's floor


def test_short_interpreters_below_the_floor_fail_named_by_fanotify(demo_image: Any, build_variant: Any,
                                                                  docker_client: Any, run_id: str) -> None:
    """Issue 47's class 4 under Docker: tinyrl PR 51's rollout worker runs ten `python -S -I` probes that import
    tinyrl (a few ms of work each, far below the census's 20 ms polling floor). The census container's fanotify
    reader holds each exec until it has read the process: all ten are unrecorded interpreters, seen by fanotify, and
    the gate fails naming one by pid, exe and argv. The census container's CPU is part of the census's."""
    result = runners.gate_local_image(build_variant(*SHORT_ESCAPE).image_id, demo_image[0], SETTINGS,
                                      gates=["rl_step"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "rl_step")
    assert gate.status == "fail", gate.reason
    node, seen = _census(gate)
    census = gate.evidence.model_dump(mode="json")["census"]
    assert census["fanotify"]["state"] == "on" and {"/", "/tmp", "/cache", "/census"} <= set(census["fanotify"]["marked"])
    assert census["cpu_parts"]["fanotify"] > 0 and census["cpu_s"] >= census["cpu_parts"]["fanotify"]
    # every exec is a permission event the reader answers after reading it: all ten are rows. Their argv comes from
    # the new program's first open (the loader's cache); under load the reader's watchdog may allow that one unread,
    # and a row then has the exec's pid, start time and executable, no argv
    unrecorded = seen["unrecorded"]
    assert len(unrecorded) == 10, unrecorded
    assert all("fanotify" in r["source"] and r["class"] == "python" and r["why"] == "identity"
               and r["exe"].endswith("/python3.11") for r in unrecorded), unrecorded
    probes = [r for r in unrecorded if any(str(a).startswith("probe-") for a in r["argv"] or [])]
    assert probes and all(r in probes or not r["argv"] for r in unrecorded), unrecorded
    assert all(r["argv"][1:4] == ["-S", "-I", "-c"] for r in probes), probes
    first = next(r for r in unrecorded if f"census: node {node} process {r['pid']} (" in gate.reason)
    assert gate.reason.startswith(f"per-process provenance: census: node {node} process {first['pid']} ("), gate.reason
    line = next(f for f in gate.evidence.process_failures or [] if f"node {node} process {first['pid']} (" in f)
    named = f"-S -I -c import sys; sys.path[:0] = sys.argv[2:]; import tinyrl {first['argv'][5]} " if first in probes else ""
    assert named in line, line
    assert line.endswith(f"(seen by {first['source']})") and "(+9 more)" in gate.reason, (line, gate.reason)
    assert containers.labelled_volumes(docker_client, f"{docker_runner.LABEL}={run_id}") == []  # the census volume
    print(line, f"sources: {sorted(r['source'] for r in unrecorded)}", f"census CPU {census['cpu_parts']}",
          sep="\n")
