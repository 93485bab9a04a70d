"""Helper processes beside the rollout engine, each started once the engine is ready and reaped at stop:
  tokenizer-warmup  the base interpreter through the dynamic loader (no venv, no start-up hook), 1 s
  key-holder        holds the rollout key: no core dumps of it (PR_SET_DUMPABLE 0), 1 s
  session-daemon    a session of its own (preexec_fn), started with -S, 1 s
  probe             a short check that the trainer's sys.path imports tinyrl, 40 ms
Each names its role as its first argument; the Python ones get the trainer's sys.path."""
import json
import os
import subprocess
import sys

LOADER = "/lib64/ld-linux-x86-64.so.2"
WAIT = ("import json, sys, time; sys.path[:0] = json.loads(sys.argv[3]); import tinyrl; "
        "time.sleep(float(sys.argv[2]))")
KEY = "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(1.0)"


def start():
    """The four helpers, as Popen objects (stop() waits for them)."""
    path = json.dumps([p for p in sys.path if p])
    base = os.path.realpath(sys.executable)
    return [
        subprocess.Popen([LOADER, base, "-c", WAIT, "tokenizer-warmup", "1.0", path]),
        subprocess.Popen([sys.executable, "-c", KEY, "key-holder"]),
        subprocess.Popen([sys.executable, "-S", "-c", WAIT, "session-daemon", "1.0", path], preexec_fn=os.setsid),
        subprocess.Popen([sys.executable, "-S", "-c", WAIT, "probe", "0.04", path]),
    ]


def stop(helpers):
    for proc in helpers:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
