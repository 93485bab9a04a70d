"""The gate's own census (acceptance.census) against the hook's records (acceptance.processes.compare): real process
trees on this host, each escape by its own mechanism (a Python process started without the recording variables, one
started with -S, one that deletes its record, an orphan, a helper that opens a component file), and hand-made rows
for the rules."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from acceptance import census, hook, processes, procfs

ROOT = Path(__file__).resolve().parents[2]

# the recipe's main process: a recorded worker (fork), then each escape, then a helper; every child lives 0.4 s
MAIN = """
import multiprocessing as mp, os, subprocess, sys, time, fakecomp
mode = sys.argv[1]
clean = {k: v for k, v in os.environ.items() if not k.startswith("TRUEPOLICY_")}
wait = "import time; time.sleep(0.4)"
if mode == "worker":
    p = mp.get_context("fork").Process(target=time.sleep, args=(0.4,), name="Worker"); p.start(); p.join()
elif mode == "stripped":
    subprocess.run([sys.executable, "-c", "import fakecomp; " + wait], env=clean, check=True)
elif mode == "no-site":
    subprocess.run([sys.executable, "-S", "-c", wait], check=True)
elif mode == "delete":
    subprocess.run([sys.executable, "-c", "import glob, os; [os.unlink(f) for f in glob.glob(os.environ["
                    "'TRUEPOLICY_PROCESS_RECORDS'] + f'/{os.getpid()}-*.jsonl')]; " + wait], check=True)
elif mode == "orphan":
    subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(0.6)"])  # its parent ends first
    os._exit(0)
elif mode == "renamed":  # a copy of the interpreter under another name, as a job's runtime environment makes
    import shutil; shutil.copy(os.path.realpath(sys.executable), "engine")
    subprocess.run(["./engine", "-S", "-c", wait], check=True)
elif mode == "loader":  # the interpreter started through the dynamic loader: the exe is ld.so
    subprocess.run(["/lib64/ld-linux-x86-64.so.2", "/usr/bin/python3.11", "-S", "-c", wait], check=True)
elif mode == "preexec":  # preexec_fn runs the hook's fork handler (a record), then the child execs python -S
    subprocess.run([sys.executable, "-S", "-c", wait], preexec_fn=lambda: None, check=True)
elif mode == "undumpable":  # a worker that makes itself unreadable (exe, maps, fds: EACCES), argv stays readable
    subprocess.run([sys.executable, "-c", "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "
                    "time.sleep(0.5)"], check=True)
elif mode == "copy":  # a copy of a component file elsewhere, under another name, opened by a helper
    import shutil; shutil.copy(fakecomp.__file__, "notes.txt")
    subprocess.run(["sh", "-c", "exec 3<notes.txt; sleep 0.4 3<&-"], check=True)
elif mode == "short":  # a short worker past the floor (docs/gates.md): no hook, imports the component, 30 ms
    subprocess.run([sys.executable, "-S", "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); import fakecomp; "
                    "time.sleep(0.03)", os.path.dirname(os.path.dirname(fakecomp.__file__))], check=True)
elif mode == "no-aslr":  # personality(ADDR_NO_RANDOMIZE), no privilege needed: exec addresses (the mark) repeat
    subprocess.run(["setarch", "-R", sys.executable, "-c", wait], check=True)
elif mode == "opener":
    subprocess.run(["sh", "-c", "exec 3<" + os.path.dirname(fakecomp.__file__) + "/__init__.py; sleep 0.4 3<&-"], check=True)
subprocess.run(["sh", "-c", "sleep 0.3"], check=True)  # a helper: no interpreter, no component file
"""


def _world(tmp_path: Path) -> tuple[dict[str, str], dict[str, Any], Path]:
    """A site dir whose sitecustomize carries the hook's .pth line, component `fakecomp`, its manifest, the env."""
    site = tmp_path / "site"
    (site / "fakecomp").mkdir(parents=True)
    (site / "sitecustomize.py").write_text(hook.PTH_LINE)
    (site / "fakecomp" / "__init__.py").write_text("VALUE = 1\n")
    real = os.path.realpath(sys.executable)
    manifest = {"site_packages": str(site), "components": {"comp": {"modules": ["fakecomp"], "native_libs": {},
                "files": {str(site / "fakecomp" / "__init__.py"): procfs.sha256(str(site / "fakecomp" /
                                                                                      "__init__.py"))}}},
                "interpreters": [{"path": real, "sha256": procfs.sha256(real)}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    records = tmp_path / "rec"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", hook.RECORDS_ENV: str(records),
           hook.MODULES_ENV: "fakecomp", hook.MANIFEST_ENV: str(tmp_path / "manifest.json")}
    return env, manifest, records


def _take(tmp_path: Path, mode: str) -> tuple[list[str], dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Run MAIN under a census as recipe.run does; (failures, census evidence, records kept, raw census)."""
    env, manifest, records = _world(tmp_path)
    seen = census.Census(str(records), census.Components(manifest), str(tmp_path / "manifest.json")).start()
    proc = subprocess.Popen([sys.executable, "-c", MAIN, mode], env=env, cwd=str(tmp_path))
    seen.own(proc.pid)
    assert proc.wait(60) == 0
    time.sleep(0.8 if mode == "orphan" else 0)  # the orphan outlives the recipe's main process: until it ends
    raw = seen.stop()
    assert raw is not None
    lost = {r["record"] for r in raw["records"] if r["lost"]}
    _, listed = processes.judge([r for r in processes.load(str(records)) if r["record"] not in lost], manifest,
                                None, [], [])
    failures, evidence = processes.compare(raw, listed)
    return failures, evidence, listed, raw


def _row(evidence: dict[str, Any], word: str) -> dict[str, Any]:
    rows = evidence["nodes"][hook.node_name()]["seen"]
    return next(r for r in rows if word in " ".join(r["argv"]) and MAIN not in r["argv"])  # not the main process


def test_recorded_worker_and_helpers_pass_and_rows_match_records(tmp_path: Path) -> None:
    failures, evidence, listed, raw = _take(tmp_path, "worker")
    assert failures == [], failures
    node = evidence["nodes"][hook.node_name()]
    main = next(r for r in node["seen"] if r["argv"][-1] == "worker" and r["ppid"] == raw["gate_pid"])
    worker = next(r for r in node["seen"] if r["ppid"] == main["pid"] and r["class"] == "python")
    assert main["record"] and worker["record"] and main["class"] == "python"
    rec = next(r for r in listed if r["pid"] == worker["pid"])
    assert (rec["node"], rec["starttime"]) == (hook.node_name(), worker["starttime"])
    assert rec["image"] == hook.image_identity(str(tmp_path / "manifest.json")) == evidence["image"]
    helper = _row(evidence, "sleep 0.3")
    assert helper["class"] == "helper" and not helper["record"] and helper["exe"].endswith("sh")
    assert any(h["pid"] == helper["pid"] for h in node["helpers"]) and node["unrecorded"] == []
    assert all(r["seen"] for r in node["recorded"]) and raw["subreaper"] and raw["polls"] > 10
    print(f"census: {raw['polls']} polls, {raw['cpu_s']} s CPU over {raw['seconds']} s")


def test_a_process_older_than_the_census_is_none_of_the_run(tmp_path: Path) -> None:
    older = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(3)"])  # e.g. another test's daemon
    try:
        time.sleep(0.05)
        failures, evidence, _, _ = _take(tmp_path, "worker")
    finally:
        older.kill()
        older.wait()
    assert failures == [] and older.pid not in {r["pid"] for r in evidence["nodes"][hook.node_name()]["seen"]}


def _escape(tmp_path: Path, mode: str, word: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    failures, evidence, _, _ = _take(tmp_path, mode)
    row = _row(evidence, word)
    assert len(failures) == 1, failures
    assert failures[0].startswith(f"census: node {hook.node_name()} process {row['pid']} ({row['exe']}: "), failures
    assert [u["pid"] for u in evidence["nodes"][hook.node_name()]["unrecorded"]] == [row["pid"]]
    print(failures[0])
    return failures[0], row, evidence


def test_python_started_without_the_recording_variables_fails_named(tmp_path: Path) -> None:
    reason, row, _ = _escape(tmp_path, "stripped", "import fakecomp")
    assert reason.endswith("ran a Python interpreter, and it left no process record") and row["python"]
    assert row["component_file_count"] == 0 or row["component_files"][0].endswith("fakecomp/__init__.py")


def test_python_without_site_never_loads_the_hook_and_fails_named(tmp_path: Path) -> None:
    reason, row, _ = _escape(tmp_path, "no-site", "-S")
    assert f"{sys.executable} -S -c import time; time.sleep(0.4))" in reason, reason


def test_a_record_deleted_during_the_run_counts_as_none(tmp_path: Path) -> None:
    reason, row, evidence = _escape(tmp_path, "delete", "glob.glob")
    lost = evidence["records_lost"]
    if lost:  # the census read it before it went: named as such
        assert lost[0]["lost"] == "deleted" and reason.endswith("deleted during the run"), (lost, reason)
        assert lost[0]["record"].startswith(f"{row['pid']}-")  # its first line, if read, names the same pid
        assert not lost[0]["first_line"] or json.loads(lost[0]["first_line"])["pid"] == row["pid"]
    else:
        assert reason.endswith("it left no process record")


def test_an_orphan_stays_a_descendant_of_the_gate(tmp_path: Path) -> None:
    _, row, _ = _escape(tmp_path, "orphan", "time.sleep(0.6)")
    assert row["python"] and row["ended"]  # seen whether first under the recipe or re-parented to the gate


def test_a_renamed_copy_of_the_interpreter_fails_by_its_content(tmp_path: Path) -> None:
    reason, row, _ = _escape(tmp_path, "renamed", "./engine")
    assert row["python"] and row["why"] == "identity" and row["exe"].endswith("/engine"), row  # its sha256
    assert reason.endswith("ran a Python interpreter, and it left no process record")


def test_the_interpreter_started_through_the_loader_fails(tmp_path: Path) -> None:
    if not os.path.exists("/usr/bin/python3.11"):
        import pytest

        pytest.skip("no Debian python3.11 here")
    reason, row, _ = _escape(tmp_path, "loader", "ld-linux")
    assert row["python"] and row["why"] == "loader" and "ld-linux" in row["exe"], row


def test_an_exec_after_the_fork_handler_s_record_fails(tmp_path: Path) -> None:
    reason, row, evidence = _escape(tmp_path, "preexec", "-S")
    assert row["record"] and row["python"], row  # a record (pid, starttime) of the fork: not the program it became
    assert "exec'd" in reason and "after its record (that program, mark" in reason, reason


def test_a_process_the_census_cannot_read_fails_closed(tmp_path: Path) -> None:
    """The census runs without CAP_SYS_PTRACE (as in a Docker container: setpriv drops it from the bounding set, so
    root's capabilities after exec lack it); the worker turns PR_SET_DUMPABLE off. It is named with uid and argv."""
    import pytest

    if not os.path.exists("/usr/bin/setpriv") or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run a census without CAP_SYS_PTRACE")
    driver = ("import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[2]); "
              "from test_census import _take; print(json.dumps(_take(Path(sys.argv[1]), 'undumpable')[0]))")
    out = subprocess.run(["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace", sys.executable, "-c",
                          driver, str(tmp_path), str(Path(__file__).parent)], capture_output=True, text=True,
                         timeout=60, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-2000:]
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(failures) == 1 and " (uid 0: " in failures[0] and "prctl(4, 0, 0, 0, 0)" in failures[0], failures
    assert "could not be read (its " in failures[0] and "permission denied), so it is unaccounted" in failures[0]
    print(failures[0])


def test_a_copy_of_a_component_file_anywhere_counts_by_its_content(tmp_path: Path) -> None:
    reason, row, _ = _escape(tmp_path, "copy", "notes.txt")
    assert row["class"] == "component files" and row["component_files"][0].endswith("/notes.txt"), row


def test_a_short_worker_past_the_floor_that_imports_a_component_fails(tmp_path: Path) -> None:
    reason, row, _ = _escape(tmp_path, "short", "import fakecomp")
    assert row["python"] and row["ended"] and reason.endswith("ran a Python interpreter, and it left no process record")


def test_a_process_without_address_randomisation_is_unaccounted(tmp_path: Path) -> None:
    import shutil

    import pytest

    if not shutil.which("setarch"):
        pytest.skip("no setarch here")
    failures, evidence, _, _ = _take(tmp_path, "no-aslr")
    row = _row(evidence, "time.sleep(0.4)")
    assert row["no_aslr"] and row["record"], row  # recorded (the hook ran), and still unaccounted
    assert failures == [f"census: node {hook.node_name()} process {row['pid']} ({row['exe']}: "
                        f"{processes.command_line(row['argv'])}) ran with ADDR_NO_RANDOMIZE (its personality): its"
                        " record cannot be told from a later exec of the same program, so it is unaccounted"], failures


def test_a_node_without_address_randomisation_accounts_for_no_process() -> None:
    raw: dict[str, Any] = {"node": "n1", "image": None, "records": [], "rows": [], "randomize_va_space": "0"}
    failures, evidence = processes.compare(raw, [])
    assert failures == ["census: node n1 runs with kernel.randomize_va_space 0: a record cannot be told from a later"
                        " exec of the same program, so no process is accounted for"]
    assert evidence["randomize_va_space"] == "0"


def test_a_helper_that_opens_a_component_file_fails(tmp_path: Path) -> None:
    reason, row, _ = _escape(tmp_path, "opener", "exec 3<")
    assert not row["python"] and row["class"] == "component files"
    assert "mapped or opened component files (" in reason and "fakecomp/__init__.py)" in reason, reason


# ---- the rules, on hand-made input


def test_a_fork_that_execs_a_helper_is_judged_by_what_it_exec_d() -> None:
    seen = census.Census("/nonexistent", census.Components({}), "/nonexistent")
    parent = census.Row(100, 5, seen.me, 0.0)
    parent.image("/usr/bin/python3.11", ["python", "-m", "trainer"])
    child = census.Row(101, 6, 100, 0.1)
    child.image("/usr/bin/python3.11", ["python", "-m", "trainer"])  # the fork's copy, before its exec
    child.images[0]["files"].add("/site/comp/_C.so")
    child.image("/usr/bin/uname", ["uname", "-p"])
    worker = census.Row(102, 7, 100, 0.1)
    worker.image("/usr/bin/python3.11", ["python", "-m", "trainer"])  # a fork that never execs: Python
    for row in (parent, child, worker):
        row.images[0]["why"] = "identity"  # what _look finds for the image's interpreter
    seen.rows = {r.key(): r for r in (parent, child, worker)}
    rows = {r["pid"]: r for r in seen.result()["rows"]}
    assert rows[101]["fork_copy"] and not rows[101]["python"] and rows[101]["component_file_count"] == 0
    assert rows[101]["execs"] == [] and rows[101]["exe"] == "/usr/bin/uname"
    assert rows[102]["python"] and not rows[102]["fork_copy"]


def test_records_rewritten_shorter_or_changed_count_as_none(tmp_path: Path) -> None:
    seen = census.Census(str(tmp_path), census.Components({}), "/nonexistent")
    line = json.dumps({"kind": "process", "pid": 7, "starttime": 70}) + "\n"
    for name in ("7-1.jsonl", "8-1.jsonl", "9-1.jsonl"):
        (tmp_path / name).write_text(line + '{"kind": "module"}\n')
    seen._read_records(final=False)
    (tmp_path / "7-1.jsonl").write_text(line)                       # shorter
    (tmp_path / "8-1.jsonl").write_text(line.replace("7", "6") + '{"kind": "module"}\n{"kind": "exit"}\n')
    (tmp_path / "9-1.jsonl").write_text(line + '{"kind": "module"}\n{"kind": "exit"}\n')  # grew: fine
    seen._read_records(final=True)
    lost = {r["record"]: r["lost"] for r in seen.result()["records"]}
    assert lost["7-1.jsonl"].startswith("rewritten shorter") and lost["8-1.jsonl"].startswith("rewritten (")
    assert lost["9-1.jsonl"] is None


def test_compare_matches_schema_1_records_by_pid_and_names_a_lost_record() -> None:
    raw = {"node": "n1", "image": "sha256:" + "a" * 64, "records": [
        {"record": "31-1.jsonl", "lost": "deleted", "first_line": json.dumps({"kind": "process", "pid": 31,
                                                                              "starttime": 310})}],
           "rows": [{"pid": 30, "starttime": 300, "ppid": 1, "exe": "/opt/venv/bin/python", "argv": ["python", "-m",
                     "x"], "python": True, "component_file_count": 0, "component_files": []},
                    {"pid": 31, "starttime": 310, "ppid": 30, "exe": "/opt/venv/bin/python", "argv": ["python", "-c",
                     "w"], "python": True, "component_file_count": 0, "component_files": []},
                    {"pid": 32, "starttime": 320, "ppid": 30, "exe": None, "argv": [], "python": False,
                     "component_file_count": 0, "component_files": []}]}
    failures, evidence = processes.compare(raw, [{"pid": 30, "record": "30-1.jsonl"}])  # schema 1: no node/starttime
    assert failures == ["census: node n1 process 31 (/opt/venv/bin/python: python -c w) ran a Python interpreter, "
                        "and its record 31-1.jsonl deleted during the run"]
    assert [r["class"] for r in evidence["nodes"]["n1"]["seen"]] == ["python", "python", "unread"]
    assert evidence["nodes"]["n1"]["recorded"] == [{"pid": 30, "starttime": None, "record": "30-1.jsonl",
                                                    "image": None, "seen": True}]
    assert evidence["rule"] == processes.HELPER_RULE and evidence["records_lost"][0]["record"] == "31-1.jsonl"


def test_a_record_from_another_image_fails() -> None:
    rec = {"pid": 5, "argv": ["python"], "mnt_ns": None, "image": "sha256:" + "b" * 64, "modules": {}, "libs": {}}
    failures = processes.judge_one(rec, {"site_packages": "/s", "components": {}}, None, [], [], "sha256:" + "a" * 64)
    assert failures == [f"process 5 (python): ran in image sha256:{'b' * 64} (its manifest's sha256), not the gate's "
                        f"sha256:{'a' * 64}"]


def test_a_copy_of_a_component_native_library_fails_by_its_sha256() -> None:
    manifest = {"site_packages": "/s", "components": {"vllm": {"native_libs": {"/s/eng/_C.so": "c" * 64}}}}
    rec = {"pid": 5, "argv": ["python"], "mnt_ns": None, "modules": {}, "libs": {"/opt/other/libfast.so": "c" * 64}}
    assert processes.judge_one(rec, manifest, None, [], []) == [
        "process 5 (python): a copy of vllm's native library loaded from /opt/other/libfast.so, not the manifest's"]


def test_every_mapped_native_library_is_attributed_or_named() -> None:
    site = "/opt/venv/lib/python3.11/site-packages"
    manifest = {"site_packages": site, "components": {}, "native_owners": {
        f"{site}/torch/lib/libtorch_cpu.so": {"distribution": "torch", "version": "2.11.0", "sha256": "a" * 64}}}
    libs = {f"{site}/torch/lib/libtorch_cpu.so": "a" * 64, "/usr/lib/x86_64-linux-gnu/libc.so.6": "b" * 64,
            "/tmp/copy/libtorch_cpu.so": "a" * 64, "/cache/jit/k.so": "c" * 64}
    rec = {"pid": 5, "argv": ["python"], "mnt_ns": None, "modules": {}, "libs": libs}
    failures, listed = processes.judge([rec], manifest, None, ["/tmp", "/cache"], ["/cache"])
    assert failures == ["process 5 (python): native library /tmp/copy/libtorch_cpu.so is not in the manifest (from"
                        " the mount at /tmp, not the image)"] and listed[0]["libraries"] == {
        f"{site}/torch/lib/libtorch_cpu.so": "torch 2.11.0", "/usr/lib/x86_64-linux-gnu/libc.so.6": "base image",
        "/tmp/copy/libtorch_cpu.so": "torch 2.11.0", "/cache/jit/k.so": "jit"}  # on a mount: by its sha256
    stray = {**rec, "libs": {f"{site}/fastlib/_x.so": "d" * 64}}  # in site-packages, in no RECORD
    failures, listed = processes.judge([stray], manifest, None, [], [])
    assert failures == [f"process 5 (python): native library {site}/fastlib/_x.so belongs to no distribution of the"
                        " image and not to the base"] and listed[0]["libraries"] == {f"{site}/fastlib/_x.so": None}


def test_recipe_gate_verdict_takes_the_census(tmp_path: Path) -> None:
    from acceptance.__main__ import by_process

    env, manifest, records = _world(tmp_path)
    records.mkdir()
    raw = {"node": "n1", "image": None, "records": [], "rows": [
        {"pid": 9, "starttime": 90, "ppid": 1, "exe": "/usr/bin/python3", "argv": ["python3", "-S", "-c", "w"],
         "python": True, "component_file_count": 0, "component_files": []}]}
    settings = {"manifest": str(tmp_path / "manifest.json"), "cache_dir": "/cache"}
    evidence: dict[str, Any] = {}
    status, reason = by_process(settings, {"processes_dir": str(records), "census": raw}, "pass", "all zero", evidence)
    assert status == "fail" and reason == (
        "per-process provenance: no process records: the image's start-up hook did not run in the recipe (+1 more)")
    assert evidence["process_failures"][1] == ("census: node n1 process 9 (/usr/bin/python3: python3 -S -c w) ran a "
                                               "Python interpreter, and it left no process record")
    assert evidence["census"]["nodes"]["n1"]["unrecorded"][0]["pid"] == 9


# ---- the recipe across nodes: the layout the settings give, and the pins fields behind it


def _layout(monkeypatch: Any, layout: dict[str, Any], rollout: bool = True, **env: str) -> Any:
    from acceptance.recipe import Layout

    for name in ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    entry = {"entry": ["python", "-m", "tinyrl.rollout_server"], "address_key": "a.address", "authkey_env": "KEY"}
    return Layout({"layout": layout, "rollout": entry if rollout else None}, "rl_step")


def test_layout_one_container_two_nodes_and_the_slurm_roles(monkeypatch: Any) -> None:
    assert not _layout(monkeypatch, {"nodes": 1}, rollout=False).split()
    one = _layout(monkeypatch, {"nodes": 2})
    assert one.one_container() and one.host == "127.0.0.1" and one.facts()["mode"] == "one container (loopback)"
    assert one.server_argv() == ["python", "-m", "tinyrl.rollout_server", "--host", "127.0.0.1", "--port", str(one.port)]
    ranks = [_layout(monkeypatch, {"nodes": 2, "address": "10.0.0.2:29500"}, SLURM_NTASKS="2", SLURM_PROCID=rank,
                     SLURM_JOB_ID="7", SLURM_STEP_ID="0") for rank in ("0", "1")]
    assert [r.role for r in ranks] == ["trainer", "rollout"] and not ranks[0].one_container()
    assert ranks[0].env() == ranks[1].env() and list(ranks[0].env()) == ["KEY"]  # both ends derive one key
    given = _layout(monkeypatch, {"nodes": 2, "role": "rollout", "address": "n2:29500", "authkey": "k"})
    assert given.env() == {"KEY": "k"} and (given.host, given.port) == ("n2", 29500)


def test_layout_refusals_name_the_setting(monkeypatch: Any) -> None:
    import pytest

    cases: list[tuple[dict[str, Any], bool, dict[str, str], str]] = [
        ({"nodes": 2}, False, {}, "settings.rollout: expected the pins' recipe.rollout"),
        ({"nodes": 2, "role": "rollout"}, True, {}, "settings.layout.address: expected HOST:PORT for the rollout"),
        ({"nodes": 2, "role": "leader", "address": "h:1"}, True, {}, "settings.layout.role: expected trainer or"),
        ({"nodes": 2, "address": "h:99999"}, True, {}, "settings.layout.address: expected HOST:PORT, got 'h:99999'"),
        ({"nodes": 2, "address": "h:1"}, True, {"SLURM_NTASKS": "3", "SLURM_PROCID": "2"}, "SLURM_PROCID: expected 0")]
    for layout, rollout, env, words in cases:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[")):
            _layout(monkeypatch, layout, rollout, **env)


def test_pins_nodes_2_needs_recipe_rollout_and_leaves_its_override_to_the_gates() -> None:
    import pytest
    import yaml

    from builder.core.errors import BadInput
    from builder.pins import model as pins_mod

    data = yaml.safe_load((ROOT / "pins" / "demo.yaml").read_text())
    pins = pins_mod.validate(data, ROOT / "pins")
    assert pins.recipe.rollout is not None and pins.recipe.rollout.entry == ["python", "-m", "tinyrl.rollout_server"]
    assert pins.acceptance.nodes == 1 and pins.recipe.rollout.authkey_env == "ROLLOUT_AUTHKEY"
    assert pins_mod.validate({**data, "acceptance": {**data["acceptance"], "nodes": 2}}, ROOT / "pins").acceptance.nodes == 2
    bad = [({**data, "acceptance": {**data["acceptance"], "nodes": 2},
             "recipe": {k: v for k, v in data["recipe"].items() if k != "rollout"}},
            "acceptance.nodes: 2 puts the rollout engine on a node of its own; expected recipe.rollout"),
           ({**data, "recipe": {**data["recipe"], "overrides": {**data["recipe"]["overrides"],
                                                                 "actor_rollout_ref.rollout.address": "h:1"}}},
            "recipe.overrides[actor_rollout_ref.rollout.address]: expected none"),
           ({**data, "recipe": {**data["recipe"], "rollout": {"entry": ["--port"]}}},
            "recipe.rollout.entry: expected a program as the first word")]
    for edited, words in bad:
        with pytest.raises(BadInput) as err:
            pins_mod.validate(edited, ROOT / "pins", "pins.yaml")
        assert str(err.value).startswith(f"pins.yaml: {words}"), str(err.value)
