"""The per-process start-up hook (acceptance.hook) and the decision over its records (acceptance.processes):
real processes (a spawned worker, a killed one) for the record format, hand-made records for the rules."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from acceptance import hook, processes, procfs

ROOT = Path(__file__).resolve().parents[2]
SITE = "/opt/venv/lib/python3.11/site-packages"
NS = "mnt:[4026532001]"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _world(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A site dir whose sitecustomize carries the .pth's line, components `fakecomp` and `fakeeng`, and the
    hook's variables. fakecomp.work runs in the worker: overlay first on its sys.path, imports, maybe SIGKILL."""
    site = tmp_path / "site"
    (site / "fakecomp").mkdir(parents=True)
    (site / "fakeeng").mkdir()
    (site / "sitecustomize.py").write_text(hook.PTH_LINE)
    (site / "fakecomp" / "__init__.py").write_text(
        "import os, sys\n\ndef work(overlay=None, kill=False):\n"
        "    if overlay:\n        sys.path.insert(0, overlay)\n"
        "    import fakeeng\n    import fakecomp.sub  # a later import event: fakeeng is recorded\n"
        "    if kill:\n        os.kill(os.getpid(), 9)\n")
    (site / "fakecomp" / "sub.py").write_text("VALUE = 1\n")
    (site / "fakeeng" / "__init__.py").write_text("ENGINE = 1\n")
    (tmp_path / "manifest.json").write_text('{"components": {}}\n')
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", hook.RECORDS_ENV: str(tmp_path / "rec"),
           hook.MODULES_ENV: "fakecomp,fakeeng", "DEMO_BATCH_INVARIANT": "1",
           hook.MANIFEST_ENV: str(tmp_path / "manifest.json")}
    return site, env


SPAWN = ("import multiprocessing as mp, os, sys, fakecomp\n"
         "ctx = mp.get_context(sys.argv[1])\n"
         "p = ctx.Process(target=fakecomp.work, args=(sys.argv[2] or None, sys.argv[3] == 'kill'), name='Worker')\n"
         "p.start(); p.join()\n"
         "os._exit(0)\n")


def _run(env: dict[str, str], method: str, overlay: str = "", kill: bool = False) -> list[dict[str, Any]]:
    """[main, worker] records (spawn also starts multiprocessing's resource tracker: recorded, checked here)."""
    proc = subprocess.run([sys.executable, "-c", SPAWN, method, overlay, "kill" if kill else ""], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    recs = processes.load(env[hook.RECORDS_ENV])
    trackers = [r for r in recs if "multiprocessing.resource_tracker" in " ".join(r["argv"])]
    assert len(trackers) == (1 if method == "spawn" else 0), [r["argv"] for r in recs]
    return [r for r in recs if r not in trackers]


def test_spawned_worker_records_itself(tmp_path: Path) -> None:
    site, env = _world(tmp_path)
    main, worker = _run(env, "spawn")
    assert worker["ppid"] == main["pid"] and worker["pid"] != main["pid"]
    assert main["argv"][:2] == [sys.executable, "-c"] or main["argv"][1] == "-c"
    assert "--multiprocessing-fork" in worker["argv"] and worker["name"] == "Worker"
    for rec in (main, worker):
        assert rec["complete"] and rec["problems"] == [] and rec["errors"] == []  # os._exit and sys.exit both
        assert rec["mnt_ns"] == os.readlink("/proc/self/ns/mnt") and rec["executable"] == sys.executable
        assert rec["env"]["DEMO_BATCH_INVARIANT"] == "1" and str(site) in rec["sys_paths"][0]
        assert any("libc" in p for p in rec["libs"]) and all(len(d or "") == 64 for d in rec["libs"].values())
        assert rec["schema"] == 3 and rec["node"] == hook.node_name() and isinstance(rec["starttime"], int)
        assert rec["mark"].count(":") == 5  # exe device and inode, stat fields 48-51 (hook.mark)
        assert rec["image"] == "sha256:" + _sha(tmp_path / "manifest.json")  # the census keys: (node, pid, starttime)
    assert worker["starttime"] >= main["starttime"]
    init = site / "fakecomp" / "__init__.py"
    assert main["modules"] == {"fakecomp": {"file": str(init), "realpath": str(init), "sha256": _sha(init)}}
    assert worker["modules"]["fakecomp.sub"]["sha256"] == _sha(site / "fakecomp" / "sub.py")
    lines = [json.loads(line) for line in Path(env[hook.RECORDS_ENV], worker["record"]).read_text().splitlines()]
    assert lines[0]["kind"] == "process" and lines[-1] == {"kind": "exit"}
    assert {line["kind"] for line in lines} <= {"process", "sys_path", "module", "lib", "name", "exit"}


def test_forked_worker_writes_its_own_record(tmp_path: Path) -> None:
    _, env = _world(tmp_path)
    main, worker = _run(env, "fork")
    assert worker["forked"] is True and worker["ppid"] == main["pid"] and worker["complete"]
    assert set(worker["modules"]) == {"fakecomp", "fakeeng", "fakecomp.sub"}  # inherited ones recorded again


def test_killed_worker_leaves_a_partial_record_that_is_judged(tmp_path: Path) -> None:
    site, env = _world(tmp_path)
    overlay = tmp_path / "overlay"
    (overlay / "fakeeng").mkdir(parents=True)
    (overlay / "fakeeng" / "__init__.py").write_text("ENGINE = 2\n")
    main, worker = _run(env, "spawn", overlay=str(overlay), kill=True)
    assert main["complete"] and not worker["complete"]  # SIGKILL: no exit line, what came before is there
    assert worker["sys_paths"][-1][0] == str(overlay) and "fakeeng" not in main["modules"]
    files = {str(p): _sha(p) for p in sorted(site.rglob("*.py")) if p.name != "sitecustomize.py"}
    manifest = {"site_packages": str(site), "components": {
        "comp": {"modules": ["fakecomp"], "native_libs": {}, "files": files},
        "eng": {"modules": ["fakeeng"], "native_libs": {}, "files": {}}}}
    failures, listed = processes.judge([main, worker], manifest, main["mnt_ns"], [], [])
    assert failures == [f"process {worker['pid']} Worker ({' '.join(worker['argv'])}): fakeeng imported from "
                        f"{overlay}/fakeeng/__init__.py, outside site-packages {site}"], failures
    assert [p["status"] for p in listed] == ["pass", "fail"] and listed[1]["complete"] is False


def test_hook_is_inert_without_its_variable(tmp_path: Path) -> None:
    _, env = _world(tmp_path)
    del env[hook.RECORDS_ENV]
    subprocess.run([sys.executable, "-c", "import fakecomp"], env=env, check=True, timeout=60)
    assert not (tmp_path / "rec").exists()


def test_stat_fields_split_after_the_last_parenthesis() -> None:
    text = "42 (a) b (c)) S 7 42 42 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 123456 1000 10"
    fields = procfs.stat_fields(text)
    assert fields is not None and (fields[0], fields[1], fields[19]) == ("S", "7", "123456")
    assert procfs.stat_fields("42 (x) S 1") is None and procfs.starttime() == procfs.starttime(os.getpid())


def test_install_writes_the_pth_into_the_prefix_site_packages(tmp_path: Path) -> None:
    path = Path(hook.install(str(tmp_path)))
    assert path.name == hook.PTH_NAME and path.read_text() == hook.PTH_LINE
    assert path.parent.name == "site-packages" and path.read_text().startswith("import ")


# ---- the decision, on hand-made records

INIT = f"{SITE}/tinyengine/__init__.py"
EXT = f"{SITE}/tinyengine/_C.cpython-311-x86_64-linux-gnu.so"
MANIFEST = {"site_packages": SITE, "components": {
    "vllm": {"modules": ["tinyengine"], "files": {INIT: "a" * 64, EXT: "b" * 64}, "native_libs": {EXT: "b" * 64}},
    "verl": {"modules": ["tinyrl"], "files": {f"{SITE}/tinyrl/__init__.py": "c" * 64}, "native_libs": {}}}}


def _rec(pid: int = 20, **changes: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"pid": pid, "ppid": 1, "argv": ["/opt/venv/bin/python", "-m", "tinyrl.main_ppo"],
                           "mnt_ns": NS, "name": None, "complete": True, "errors": [], "problems": [],
                           "sys_paths": [[SITE]], "env": {},
                           "modules": {"tinyengine": {"file": INIT, "realpath": INIT, "sha256": "a" * 64},
                                       "tinyengine._C": {"file": EXT, "realpath": EXT, "sha256": "b" * 64}},
                           "libs": {EXT: "b" * 64, "/usr/lib/x86_64-linux-gnu/libc.so.6": "d" * 64}}
    rec.update(changes)
    return rec


def _judge(*recs: dict[str, Any], mounts: list[str] | None = None) -> list[str]:
    return processes.judge(list(recs), MANIFEST, NS, mounts or ["/tmp", "/cache"], ["/cache"])[0]


def test_clean_processes_pass_and_are_listed() -> None:
    failures, listed = processes.judge([_rec(), _rec(21, name="RolloutWorker")], MANIFEST, NS, ["/tmp"], [])
    assert failures == []
    assert [(p["pid"], p["name"], p["status"]) for p in listed] == [(20, None, "pass"), (21, "RolloutWorker", "pass")]
    assert listed[0]["modules"] == {"tinyengine": INIT, "tinyengine._C": EXT} and listed[0]["libs"] == 2


def test_no_records_fail() -> None:
    assert _judge() == ["no process records: the image's start-up hook did not run in the recipe"]


def test_component_from_an_overlay_names_the_worker_and_path() -> None:
    worker = _rec(21, argv=["python", "-c", "spawn_main()", "--multiprocessing-fork"], name="RolloutWorker",
                  modules={"tinyengine": {"file": "/tmp/x/tinyengine/__init__.py",
                                          "realpath": "/tmp/x/tinyengine/__init__.py", "sha256": "a" * 64}})
    assert _judge(_rec(), worker) == [
        "process 21 RolloutWorker (python -c spawn_main() --multiprocessing-fork): tinyengine imported from "
        f"/tmp/x/tinyengine/__init__.py, outside site-packages {SITE}"]


def test_changed_and_unlisted_files_fail() -> None:
    extra = f"{SITE}/tinyengine/patch.py"
    rec = _rec(modules={"tinyengine": {"file": INIT, "realpath": INIT, "sha256": "e" * 64},
                        "tinyengine.patch": {"file": extra, "realpath": extra, "sha256": "f" * 64},
                        "tinyrl": {"file": None, "realpath": None, "sha256": None}})
    failures = _judge(rec)
    assert f"tinyengine file {INIT} sha256 {'e' * 64} differs from the manifest" in failures[0]
    assert f"tinyengine.patch imported from {extra}, a file the manifest does not list" in failures[1]
    assert "component module tinyrl has no file" in failures[2] and len(failures) == 3


def test_native_library_rules() -> None:
    other = "/tmp/tinyrl_ext_1/_C.cpython-311-x86_64-linux-gnu.so"
    rec = _rec(libs={EXT: "0" * 64, other: "1" * 64, f"{SITE}/tinyengine/_extra.so": "2" * 64,
                     "/tmp/libhelper.so": "3" * 64, "/cache/triton/abc/cuda_utils.so": "4" * 64,
                     "/usr/lib/x86_64-linux-gnu/libcuda.so.1": "5" * 64, "/usr/lib/libgone.so (deleted)": None,
                     f"{SITE}/torch/_C.cpython-311-x86_64-linux-gnu.so": "6" * 64})  # another package's _C: fine
    failures = _judge(rec, mounts=["/tmp", "/cache", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"])
    assert failures == [
        f"process 20 (/opt/venv/bin/python -m tinyrl.main_ppo): vllm native library {EXT} sha256 {'0' * 64} differs "
        "from the manifest",
        f"process 20 (/opt/venv/bin/python -m tinyrl.main_ppo): another build of vllm's "
        f"_C.cpython-311-x86_64-linux-gnu.so loaded from {other}, not in the manifest",
        f"process 20 (/opt/venv/bin/python -m tinyrl.main_ppo): vllm native library {SITE}/tinyengine/_extra.so is "
        "not in the manifest",
        "process 20 (/opt/venv/bin/python -m tinyrl.main_ppo): native library /tmp/libhelper.so is not in the "
        "manifest (from the mount at /tmp, not the image)",
        "process 20 (/opt/venv/bin/python -m tinyrl.main_ppo): native library /usr/lib/libgone.so (deleted) is not "
        "in the manifest (its file was deleted)"]  # JIT cache and runtime-mounted driver file: allowed


def test_other_mount_namespace_and_recording_errors_fail() -> None:
    failures = _judge(_rec(mnt_ns="mnt:[4026532999]", errors=["OSError: disk full"]))
    assert failures == [
        f"process 20 (/opt/venv/bin/python -m tinyrl.main_ppo): mount namespace mnt:[4026532999], expected the "
        f"gate's {NS}",
        "process 20 (/opt/venv/bin/python -m tinyrl.main_ppo): the start-up hook could not record: OSError: disk full"]


def test_partial_record_parses_what_was_written() -> None:
    text = "\n".join(json.dumps(x) for x in (
        {"kind": "process", "pid": 7, "ppid": 1, "argv": ["python"], "mnt_ns": NS, "sys_path": ["/a"]},
        {"kind": "sys_path", "sys_path": ["/overlay", "/a"]},
        {"kind": "module", "name": "tinyengine", "file": "/overlay/tinyengine/__init__.py",
         "realpath": "/overlay/tinyengine/__init__.py", "sha256": "a" * 64})) + '\n{"kind": "li'
    rec = processes.parse(text)
    assert rec["pid"] == 7 and rec["complete"] is False and rec["problems"] == ["line 4 unreadable (cut short?)"]
    assert rec["sys_paths"] == [["/a"], ["/overlay", "/a"]]
    assert _judge(rec | {"record": "7-1.jsonl"}) == [
        f"process 7 (python): tinyengine imported from /overlay/tinyengine/__init__.py, outside site-packages {SITE}"]


def test_recipe_gate_verdict_takes_the_process_evidence(tmp_path: Path) -> None:
    from acceptance.__main__ import by_process

    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(MANIFEST))
    records = tmp_path / "rec"
    records.mkdir()
    bad = {"kind": "module", "name": "tinyengine", "file": "/tmp/o/tinyengine/__init__.py",
           "realpath": "/tmp/o/tinyengine/__init__.py", "sha256": "a" * 64}
    head = {"kind": "process", "pid": 9, "ppid": 1, "argv": ["python", "-c", "w"], "sys_path": [],
            "mnt_ns": os.readlink("/proc/self/ns/mnt")}
    (records / "9-1.jsonl").write_text(json.dumps(head) + "\n" + json.dumps(bad) + "\n")
    settings = {"manifest": str(manifest), "cache_dir": "/cache"}
    evidence: dict[str, Any] = {}
    status, reason = by_process(settings, {"processes_dir": str(records)}, "pass", "all zero", evidence)
    assert status == "fail" and reason == ("per-process provenance: process 9 (python -c w): tinyengine imported from "
                                           f"/tmp/o/tinyengine/__init__.py, outside site-packages {SITE}")
    assert evidence["processes"][0]["pid"] == 9 and evidence["processes"][0]["complete"] is False
    status, reason = by_process(settings, {"processes_dir": str(records)}, "fail", "step 1: diff", {})
    assert reason.endswith("; the run itself: step 1: diff")
    off: dict[str, Any] = {}
    assert by_process({**settings, "process_records": False}, {}, "pass", "ok", off) == ("pass", "ok")
    assert off["processes"].startswith("off")


def test_the_hook_runs_by_path_with_its_sibling_reader_alone(tmp_path: Path) -> None:
    """The build runs `python hook.py install PREFIX` before the suite is importable: hook.py loads procfs.py, the
    one /proc reader, as the file beside it (`-S`: no site-packages, so no installed `acceptance`)."""
    root = Path(hook.__file__).parent
    for name in ("hook.py", "procfs.py"):
        (tmp_path / name).write_bytes((root / name).read_bytes())
    run = [sys.executable, "-S", str(tmp_path / "hook.py"), "install", str(tmp_path / "prefix")]
    done = subprocess.run(run, capture_output=True, text=True, cwd="/", timeout=60)
    assert done.returncode == 0 and done.stdout.strip().endswith(hook.PTH_NAME), done.stderr
    (tmp_path / "procfs.py").unlink()  # without the reader beside it the hook cannot load
    done = subprocess.run(run, capture_output=True, text=True, cwd="/", timeout=60)
    assert done.returncode != 0 and "No module named 'procfs'" in done.stderr


def test_the_suite_reads_proc_in_one_module() -> None:
    """`_read`, `_link`, `_sha256` and maps parsing once, in acceptance/procfs.py (they were in hook, census, jitcache)."""
    root = Path(hook.__file__).parent
    again = [f"{p.name}: {line.strip()}" for p in sorted(root.glob("*.py")) if p.name != "procfs.py"
             for line in p.read_text().splitlines()
             if line.startswith(("def _read(", "def _link(", "def _sha256(", "def sha256(", "def mapped(", "def is_shared("))]
    assert again == []
