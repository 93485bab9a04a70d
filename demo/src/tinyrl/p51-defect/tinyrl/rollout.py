"""Rollout in a worker process, as verl's rollout workers: the engine lives in its own process, gets the
trainer's weights after every step and returns the sampled tokens, their logprobs and its own CPU time.
The worker is forked where that is safe (no CUDA context and one intra-op thread in the trainer: torch is not
imported a second time), spawned otherwise. The trainer never imports the engine: the worker imports it after
runtime_env: {"env_vars": {...}} is set (PYTHONPATH entries go first on its sys.path, as a fresh interpreter
would put them). RemoteRollout is the same handle on a rollout server in another process, maybe on another node,
reached over TCP (python -m tinyrl.rollout_server; the shared key in ROLLOUT_AUTHKEY)."""
import multiprocessing
import os
import pickle
import sys
import time
import traceback
from multiprocessing.connection import Client

from tinyrl import probes

AUTHKEY_ENV = "ROLLOUT_AUTHKEY"
CONNECT_TIMEOUT_ENV = "ROLLOUT_CONNECT_TIMEOUT_S"


def _apply(runtime_env):
    env_vars = {k: str(v) for k, v in (runtime_env.get("env_vars") or {}).items()}
    os.environ.update(env_vars)
    paths = [p for p in env_vars.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in paths if p not in sys.path]


def _serve(conn, runtime_env):
    _apply(runtime_env)
    import torch

    if "OMP_NUM_THREADS" not in os.environ:  # as the trainer: one intra-op thread per worker
        torch.set_num_threads(1)
    from tinyengine import LLM

    engine = LLM()  # reads DEMO_BATCH_INVARIANT; on the first GPU when torch sees one (DEMO_DEVICE)
    conn.send(("ready", {"device": str(getattr(engine, "device", "cpu")),
                         "batch_invariant": bool(getattr(engine, "batch_invariant", False))}))
    probes.run()  # quick checks that the trainer's sys.path imports tinyrl (tinyrl/probes.py)
    while True:
        command, args = conn.recv()
        if command == "stop":
            return
        try:
            if command == "load_weights":
                result = engine.load_weights(args)
            else:  # generate
                cpu0 = time.process_time()
                out = engine.generate(*args[0], **args[1])
                result = (out.tokens, out.logprobs, time.process_time() - cpu0)
            conn.send(("ok", result))
        except Exception as err:  # the trainer re-raises it: the run fails with the rollout's error
            traceback.print_exc()
            conn.send(("error", err))


def _main(conn, runtime_env):
    try:
        _serve(conn, runtime_env)
    except Exception as err:
        traceback.print_exc()
        conn.send(("error", err))


def _start_method(torch):
    """fork unless this process holds what a fork breaks: a CUDA context, or an intra-op thread pool."""
    if torch.cuda.is_initialized() or torch.get_num_threads() != 1:
        return "spawn"
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class _Rollout:
    """The commands both handles send: load_weights(state_dict), generate(prompts, ...), close()."""

    def _ready(self):
        import torch

        info = self._reply()
        self.device = torch.device(info["device"])
        self.batch_invariant = info["batch_invariant"]
        self.cpu_s = 0.0  # the rollout process's CPU time in the last generate

    def _reply(self):
        try:
            status, value = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"{self._who()} died ({self._ended()})") from None
        if status == "error":
            raise value
        return value

    def load_weights(self, state_dict):
        return self._call("load_weights", {k: v.detach().cpu() for k, v in state_dict.items()})

    def generate(self, *args, **kwargs):
        tokens, logprobs, self.cpu_s = self._call("generate", (args, kwargs))
        return tokens, logprobs

    def _call(self, command, args):
        self.conn.send((command, args))
        return self._reply()


class RolloutWorker(_Rollout):
    """The rollout engine in a worker process of the trainer."""

    def __init__(self, runtime_env=None):
        import torch

        ctx = multiprocessing.get_context(_start_method(torch))
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_main, args=(child, runtime_env or {}), name="RolloutWorker", daemon=True)
        self.proc.start()
        child.close()
        self._ready()

    def _who(self):
        return f"rollout worker {self.proc.pid}"

    def _ended(self):
        self.proc.join(5)
        return f"exit code {self.proc.exitcode}"

    def close(self):
        if self.proc.is_alive():
            self.conn.send(("stop", None))
            self.proc.join(30)


class Plain:
    """A connection that pickles with plain pickle: over TCP a tensor must travel as bytes, not as the file
    descriptor of its shared memory (multiprocessing's pickler with torch's reductions)."""

    def __init__(self, conn):
        self.conn = conn

    def send(self, obj):
        self.conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self):
        return pickle.loads(self.conn.recv_bytes())

    def close(self):
        self.conn.close()


def connect(address, timeout_s, authkey=None):
    """A Client to HOST:PORT, retried while the server is not listening yet (it may start after the trainer)."""
    host, _, port = address.rpartition(":")
    key = (authkey or os.environ.get(AUTHKEY_ENV, "")).encode()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Plain(Client((host, int(port)), authkey=key))
        except (ConnectionRefusedError, ConnectionResetError, FileNotFoundError) as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rollout server {address}: not reachable after {timeout_s:g} s ({err})") from None
            time.sleep(0.05)


class RemoteRollout(_Rollout):
    """The rollout engine in a rollout server at HOST:PORT (python -m tinyrl.rollout_server), over TCP."""

    def __init__(self, address, authkey=None):
        self.address = address
        self.conn = connect(address, float(os.environ.get(CONNECT_TIMEOUT_ENV, "120")), authkey)
        self._ready()

    def _who(self):
        return f"rollout server {self.address}"

    def _ended(self):
        return "connection closed"

    def close(self):
        self.conn.send(("stop", None))
        self.conn.close()
