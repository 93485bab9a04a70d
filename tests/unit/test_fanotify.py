"""The census's kernel events (issue 47, class 4): the fanotify reader (acceptance/fanotify.py) against a stand-in
gate on this host, the gate's side that merges what it saw into the census (acceptance/exec_events.py), and the
census container the Docker runner starts beside a recipe gate. The reader needs CAP_SYS_ADMIN (this host runs the
tests as root); the stand-in gate has its own mount namespace and its own copies of the loader's start files, so
the reader's marks never reach this host's processes."""
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from acceptance import processes
from acceptance.exec_events import POLL_FLOOR, ExecEvents
from acceptance.fanotify import resolve

GATE = r'''
import ctypes, os, shutil, subprocess, sys, tempfile
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
assert libc.unshare(0x20000) == 0, os.strerror(ctypes.get_errno())  # CLONE_NEWNS
assert libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None) == 0  # MS_REC | MS_PRIVATE
work = tempfile.mkdtemp()
maps = open("/proc/self/maps").read()
libc_path = next(line.split()[-1] for line in maps.splitlines() if "/libc.so" in line)
for path in ("/etc/ld.so.cache", libc_path):  # copies: the reader's inode marks stay in this namespace
    copy = os.path.join(work, os.path.basename(path))
    shutil.copy(path, copy)
    assert libc.mount(copy.encode(), path.encode(), None, 0x1000, None) == 0  # MS_BIND
print("ready", flush=True)
sys.stdin.readline()
short = subprocess.Popen([sys.executable, "-S", "-I", "-c", "pass", "short-one"])
short.wait()
print(short.pid, flush=True)
sys.stdin.readline()
'''


def _fanotify_allowed() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.fanotify_init(0x4 | 0x1, os.O_RDONLY)
    if fd >= 0:
        os.close(fd)
    return bool(fd >= 0)


@pytest.mark.skipif(not _fanotify_allowed(), reason="fanotify with permission events needs CAP_SYS_ADMIN")
def test_the_reader_sees_a_1_ms_interpreter_with_its_argv(tmp_path: Path) -> None:
    """A `python -S -I -c pass` run (its whole life a few ms) is read at its exec (pid, starttime, the file:
    identity, the gate's own interpreter) and at its loader's first open (exe, argv, mark); /proc, which permission
    events may not mark, is named with the kernel's answer."""
    out = tmp_path / "events.jsonl"
    with subprocess.Popen([sys.executable, "-c", GATE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as gate:
        assert gate.stdout is not None and gate.stdin is not None and gate.stdout.readline().strip() == "ready"
        with subprocess.Popen([sys.executable, "-m", "acceptance.fanotify", "--pid", str(gate.pid), "--out", str(out),
                               "--manifest", "/nothing"]) as reader:
            try:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and b'"ready"' not in (out.read_bytes() if out.exists() else b""):
                    time.sleep(0.01)
                gate.stdin.write("\n")
                gate.stdin.flush()
                pid = int(gate.stdout.readline())
                gate.stdin.write("\n")
                gate.stdin.flush()
                gate.wait(10)
                reader.wait(10)  # it ends once the gate is gone
            finally:
                for proc in (gate, reader):
                    if proc.poll() is None:
                        proc.kill()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    ready = lines[0]
    assert ready["kind"] == "ready" and "/" in ready["marked"] and "/etc/ld.so.cache" in ready["watched"], ready
    assert {"mount": "/proc", "fstype": "proc", "error": "Invalid argument"} in ready["unmarked"]
    execs = [e for e in lines if e["kind"] == "exec" and e["pid"] == pid]
    assert execs[0]["why"] == "identity" and execs[0]["exe"] == os.path.realpath(sys.executable), execs
    start = next(e for e in lines if e["kind"] == "start" and e["pid"] == pid)
    assert start["argv"][1:] == ["-S", "-I", "-c", "pass", "short-one"] and start["why"] == "identity", start
    assert start["starttime"] == execs[0]["starttime"] and start["mark"].count(":") == 5
    assert not [e for e in lines if e["kind"] == "error"]


def test_resolve_follows_links_inside_another_root(tmp_path: Path) -> None:
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/libc.so.6").write_text("x")
    (tmp_path / "lib").symlink_to("usr/lib")
    (tmp_path / "usr/lib/abs").symlink_to("/usr/lib/libc.so.6")  # absolute: starts again at the other root
    assert resolve(str(tmp_path), "/lib/libc.so.6") == f"{tmp_path}/usr/lib/libc.so.6"
    assert resolve(str(tmp_path), "/lib/abs") == f"{tmp_path}/usr/lib/libc.so.6"


# ---- the gate's side: what the reader saw, merged into the census


def _events(lines: list[dict[str, Any]], state: str = "on", syncs: tuple[int, ...] = (90,)) -> ExecEvents:
    events = ExecEvents("/census/events.jsonl")
    events.state, events.lines, events.syncs = state, lines, list(syncs)
    events.ready = {"marked": ["/", "/tmp"], "unmarked": [], "watched": ["/etc/ld.so.cache"]}
    return events


PROBE = ["/opt/venv/bin/python", "-S", "-I", "-c", "import tinyrl", "probe-0"]
LINES = [
    {"kind": "exec", "pid": 70, "starttime": 500, "ppid": 7, "exe": "/usr/bin/python3.11", "why": "identity",
     "t": 10.5, "cpu_s": 0.02},
    {"kind": "exec", "pid": 70, "starttime": 500, "ppid": 7, "exe": "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
     "why": None, "t": 10.5, "cpu_s": 0.02},
    {"kind": "start", "pid": 70, "starttime": 500, "ppid": 7, "exe": "/usr/bin/python3.11", "argv": PROBE,
     "mark": "1:2:3:4:5:6", "why": "identity", "t": 10.501},
    {"kind": "exec", "pid": 71, "starttime": 501, "ppid": 7, "exe": "/usr/bin/uname", "why": None, "t": 10.6},
    {"kind": "exec", "pid": 90, "starttime": 502, "ppid": 1, "exe": "/usr/bin/true", "why": None, "t": 10.7,
     "cpu_s": 0.05},
    {"kind": "exec", "pid": 60, "starttime": 100, "ppid": 1, "exe": "/usr/bin/python3.11", "why": "identity",
     "t": 1.0},  # before the census: none of the run
]


def _census(rows: list[dict[str, Any]], events: ExecEvents) -> dict[str, Any]:
    merged = events.merge(rows, since=400, skip={90, 1}, started=10.0)
    return {"node": "n1", "image": "sha256:x", "rows": merged, "records": [], "cpu_s": 0.1,
            "fanotify": events.evidence()}


def test_an_interpreter_only_fanotify_saw_fails_named_by_pid_exe_and_argv() -> None:
    failures, evidence = processes.compare(_census([], _events(LINES)), [])
    assert failures == ["census: node n1 process 70 (/usr/bin/python3.11: /opt/venv/bin/python -S -I -c import tinyrl"
                        " probe-0) ran a Python interpreter, and it left no process record (seen by fanotify)"]
    row = evidence["nodes"]["n1"]["unrecorded"][0]
    assert row["source"] == "fanotify" and row["why"] == "identity" and row["ppid"] == 7
    assert evidence["fanotify"]["state"] == "on" and evidence["fanotify"]["execs"] == 4  # the sync exec left out
    assert evidence["fanotify"]["cpu_s"] == 0.05 and evidence["fanotify"]["floor"] is None


def test_a_recorded_interpreter_both_saw_passes_and_says_both_sources() -> None:
    row = {"pid": 70, "starttime": 500, "ppid": 7, "exe": "/usr/bin/python3.11", "argv": PROBE, "python": True,
           "why": "identity", "images": [{"mark": "1:2:3:4:5:6", "why": "identity", "exe": "/usr/bin/python3.11",
                                          "component_files": 0}], "unreadable": [], "component_files": [],
           "component_file_count": 0, "first_s": 0.5}
    record = {"pid": 70, "starttime": 500, "node": "n1", "record": "70-x.jsonl", "mark": "1:2:3:4:5:6"}
    failures, evidence = processes.compare(_census([row], _events(LINES)), [record])
    assert failures == [] and evidence["nodes"]["n1"]["seen"][0]["source"] == "poll+fanotify"
    other = dict(record, mark="1:2:9:9:9:9")  # the record is of another program: the exec fanotify saw has none
    failures, _ = processes.compare(_census([json.loads(json.dumps(row))], _events(LINES)), [other])
    assert len(failures) == 1 and "after its record (that program, mark 1:2:3:4:5:6" in failures[0], failures


def test_without_a_reader_the_census_polls_and_says_its_floor() -> None:
    events = _events(LINES, state="off")
    events.why = "no fanotify reader was ready within 30 s"
    failures, evidence = processes.compare(_census([], events), [])
    assert failures == [] and evidence["fanotify"]["floor"] == POLL_FLOOR
    assert evidence["fanotify"]["why"] == "no fanotify reader was ready within 30 s"


def test_a_reader_that_stopped_during_the_run_fails_the_gate() -> None:
    events = _events(LINES, state="lost")
    events.why = "the reader did not report the gate's closing exec: it stopped meanwhile"
    failures, _ = processes.compare(_census([], events), [])
    assert any("fanotify reader stopped during the run" in f for f in failures), failures


# ---- the census container


def test_the_census_container_is_the_gate_s_image_read_only_with_two_capabilities() -> None:
    from builder.gating.settings import GateCall, GateSettings
    from builder.pins.model import load
    from builder.runners.docker_runner import CENSUS_EVENTS, census_spec, container_spec

    pins = load(Path(__file__).resolve().parents[2] / "pins" / "demo.yaml")
    census = census_spec(pins, "sha256:abc", "builder-census-1", {"l": "1"})
    kwargs = census.sdk_kwargs()
    assert kwargs["image"] == "sha256:abc" and kwargs["network_mode"] == "none" and kwargs["read_only"] is True
    assert kwargs["cap_drop"] == ["ALL"] and kwargs["cap_add"] == ["SYS_ADMIN", "SYS_PTRACE"]
    assert kwargs["security_opt"] == ["no-new-privileges"] and census.command[1:3] == ["-m", "acceptance.fanotify"]
    assert [(m["Target"], m["Source"], m["ReadOnly"]) for m in kwargs["mounts"]] == [
        ("/census", "builder-census-1", False)]
    gate = container_spec(pins, "sha256:abc", GateCall("rl_step", GateSettings.of(pins)), "run1", "builder-census-1")
    gate_kwargs = gate.sdk_kwargs()
    assert ("/census", "builder-census-1", True) in [(m["Target"], m["Source"], m["ReadOnly"])
                                                     for m in gate_kwargs["mounts"]]
    assert "cap_add" not in gate_kwargs and json.loads(gate.command[-1])["census_events"] == CENSUS_EVENTS


def test_a_fork_the_poll_saw_before_its_exec_is_named_by_the_program_it_exec_d() -> None:
    """The poll saw the worker's fork (its parent's program, still before the exec); fanotify saw what it exec'd:
    the failure names the probe, not the fork's copy of the worker."""
    fork = {"pid": 70, "starttime": 500, "ppid": 7, "exe": "/usr/bin/python3.11", "argv": ["python", "-m", "worker"],
            "execs": [], "python": True, "why": "identity", "unreadable": [], "component_files": [],
            "component_file_count": 0, "first_s": 0.5,
            "images": [{"mark": "1:2:0:0:0:0", "why": "identity", "exe": "/usr/bin/python3.11", "component_files": 0}]}
    failures, evidence = processes.compare(_census([fork], _events(LINES)), [])
    assert failures == ["census: node n1 process 70 (/usr/bin/python3.11: /opt/venv/bin/python -S -I -c import tinyrl"
                        " probe-0) ran a Python interpreter, and it left no process record (seen by poll+fanotify)"]
    row = evidence["nodes"]["n1"]["seen"][0]
    assert [i["mark"] for i in row["images"]] == ["1:2:0:0:0:0", "1:2:3:4:5:6"]


def test_the_report_says_how_the_census_looked_and_which_look_saw_a_process() -> None:
    from builder.core.records import GateResult
    from builder.report.document import census_markdown

    _, evidence = processes.compare(_census([], _events(LINES)), [])
    gate = GateResult.model_validate({"name": "rl_step", "status": "fail", "reason": "x",
                                      "evidence": {"census": evidence}})
    row = next(line for line in census_markdown([gate]) if line.startswith("| rl_step |"))
    assert "| poll + fanotify | 70 /usr/bin/python3.11 (python, seen by fanotify) |" in row, row
    off = _events(LINES, state="off")
    off.why = "no fanotify reader was ready within 30 s"
    _, evidence = processes.compare(_census([], off), [])
    gate = GateResult.model_validate({"name": "rl_step", "status": "pass", "reason": "x",
                                      "evidence": {"census": evidence}})
    row = next(line for line in census_markdown([gate]) if line.startswith("| rl_step |"))
    assert "| poll only (no fanotify reader was ready within 30 s) | none |" in row, row


def test_an_interpreter_exec_read_after_its_process_ended_still_fails() -> None:
    """Under load the watchdog may let an exec run before the reader got to it; the reader then finds no /proc entry
    (no start time, no argv), but the file it exec'd was an interpreter: the census fails naming pid and exe."""
    gone = {"kind": "exec", "pid": 77, "starttime": None, "ppid": None, "exe": "/usr/bin/python3.11",
            "why": "identity", "t": 10.8}
    failures, evidence = processes.compare(_census([], _events([*LINES, gone])), [])
    assert len(failures) == 2 and any("process 77 (/usr/bin/python3.11" in f and "seen by fanotify" in f
                                      for f in failures), failures
    row = next(r for r in evidence["nodes"]["n1"]["unrecorded"] if r["pid"] == 77)
    assert row["source"] == "fanotify" and row["argv"] == [] and row["starttime"] == -1
