"""Run the recipe once (one arm) under the gate's census and parse what it logged; never imports the components.
With settings.layout nodes 2 the rollout engine runs in its own process over TCP (Layout; serve() is the rollout
node's side)."""
import hashlib
import io
import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, cast

from acceptance import census, processes
from acceptance import metrics as m
from acceptance.decide import Run
from acceptance.exec_events import census_events_path

TAIL = 6000


def hydra(value: object) -> str:
    """Command-line form of one override value (Hydra syntax)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(hydra(v) for v in value) + "]"
    return str(value)


def arm(settings: dict[str, Any], gate: str) -> tuple[dict[str, Any], float]:
    """(arm env, learning rate) of a gate: zero_update = aligned at lr 0, rl_step = aligned at the recipe's lr,
    control = control env at the recipe's lr."""
    if gate == "zero_update":
        return settings["aligned_env"], 0.0
    if gate == "rl_step":
        return settings["aligned_env"], float(settings["lr"])
    if gate == "control":
        return settings["control_env"], float(settings["lr"])
    raise ValueError(f"no recipe arm for gate {gate!r}")


def command(settings: dict[str, Any], lr: float, log_path: str,
            extra: dict[str, Any] | None = None) -> tuple[list[str], dict[str, str]]:
    """argv and env of one run: entry + overrides (+ extra, e.g. the checkpoint options), steps and lr set,
    logger to console and file."""
    overrides = {**(settings.get("overrides") or {}), **(extra or {})}
    overrides[settings["steps_key"]] = int(settings["steps"])
    overrides[settings["lr_key"]] = lr
    overrides[settings.get("logger_key", "trainer.logger")] = list(settings.get("logger", ["console", "file"]))
    argv = list(settings["entry"]) + [f"{k}={hydra(v)}" for k, v in overrides.items()]
    env = {"VERL_FILE_LOGGER_PATH": log_path}
    return argv, env


NODE_ENV = "TRUEPOLICY_NODE_ENV"  # the names of the recipe's variables that the node's own environment set
STEP_PORT_ENV = "TRUEPOLICY_STEP_PORT"  # the port Slurm reserved for the step (srun --resv-ports), set by the runner


class Layout:
    """Where the recipe's parts run (settings.layout): nodes 1, the recipe alone; nodes 2, the rollout engine in
    its own process reached over TCP. role trainer or rollout: this container is one of two nodes (the role given,
    else SLURM_PROCID 0 or 1 when the step has two tasks) and address is HOST:PORT of the rollout node; no role and
    no address: both in this container, the gate starting the rollout server itself on loopback."""

    def __init__(self, settings: dict[str, Any], gate: str) -> None:
        given = settings.get("layout") or {}
        self.nodes = int(given.get("nodes") or 1)
        self.rollout: dict[str, Any] = settings.get("rollout") or {}
        self.role: str | None = given.get("role")
        self.address: str | None = given.get("address")
        port = os.environ.get(STEP_PORT_ENV, "")
        if not self.address and given.get("rollout_host") and port.isdigit():  # a Slurm step: the rollout node's
            self.address = f"{given['rollout_host']}:{port}"                # address, the step's reserved port
        if self.nodes < 2:
            return
        if not self.rollout.get("entry"):
            raise ValueError("settings.rollout: expected the pins' recipe.rollout (entry, address_key) for layout"
                             f" nodes {self.nodes}")
        if self.role is None and int(os.environ.get("SLURM_NTASKS") or 1) > 1:
            self.role = {"0": "trainer", "1": "rollout"}.get(os.environ.get("SLURM_PROCID", ""))
            if self.role is None:
                raise ValueError(f"SLURM_PROCID: expected 0 (trainer) or 1 (rollout), got {os.environ.get('SLURM_PROCID')!r}")
        if self.role not in (None, "trainer", "rollout"):
            raise ValueError(f"settings.layout.role: expected trainer or rollout, got {self.role!r}")
        if self.role is not None and not self.address:
            raise ValueError(f"settings.layout.address: expected HOST:PORT for the {self.role} role")
        if self.address is None:
            self.address = f"127.0.0.1:{free_port()}"
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"settings.layout.address: expected HOST:PORT, got {self.address!r}")
        self.host, self.port = host, int(port)
        named = f"truepolicy-rollout|{settings.get('gate') or gate}|{self.address}|{os.environ.get('SLURM_JOB_ID', '')}"
        self.key = str(given.get("authkey") or (secrets.token_hex(16) if self.one_container() else
                                                hashlib.sha256(named.encode()).hexdigest()))

    def split(self) -> bool:
        return self.nodes > 1

    def one_container(self) -> bool:
        return self.split() and self.role is None

    def env(self) -> dict[str, str]:
        """The shared key both ends read (recipe.rollout.authkey_env)."""
        return {str(self.rollout.get("authkey_env") or "ROLLOUT_AUTHKEY"): self.key} if self.split() else {}

    def server_argv(self) -> list[str]:
        return [*self.rollout["entry"], "--host", self.host, "--port", str(self.port)]

    def facts(self) -> dict[str, Any]:
        if not self.split():
            return {"nodes": 1}
        return {"nodes": self.nodes, "role": self.role or "trainer", "address": self.address,
                "mode": "one container (loopback)" if self.one_container() else "node"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def arm_of(settings: dict[str, Any], gate: str) -> tuple[dict[str, Any], float]:
    """arm() of a recipe gate; the performance gate's arm from settings.arm."""
    if gate == "performance":
        return arm(settings, "rl_step" if settings.get("arm") == "aligned" else "control")
    return arm(settings, gate)


def _census(settings: dict[str, Any], records: Path) -> census.Census:
    manifest = settings.get("manifest", "/opt/delivery/manifest.json")
    return census.Census(str(records), census.Components(census.load_manifest(manifest)), manifest,
                         enabled=settings.get("census") is not False, events=census_events_path(settings))


def _base_env(settings: dict[str, Any], arm_env: dict[str, Any], records: Path, layout: Layout) -> dict[str, str]:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (settings.get("env") or {}).items()})
    env.update({k: str(v) for k, v in arm_env.items()})
    shutil.rmtree(records, ignore_errors=True)
    env.update(processes.recording_env(settings, str(records)))  # every Python process records itself here
    env.update(layout.env())
    return env


def _stream(proc: "subprocess.Popen[bytes]", out: IO[bytes]) -> str:
    """The process's output into `out` and the container log as it goes; its whole text."""
    stdout = cast(io.BufferedReader, proc.stdout)  # stdout=PIPE with the default buffering
    for chunk in iter(lambda: stdout.read1(65536), b""):
        out.write(chunk)
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
    proc.wait()
    out.seek(0)
    return out.read().decode("utf-8", "replace")


def _start_server(layout: Layout, env: dict[str, str], work: Path, gate: str, seen: census.Census
                  ) -> tuple["subprocess.Popen[bytes]", IO[bytes]]:
    """Both roles in one container: the rollout server as the gate's own child, under the same census."""
    log = open(work / f"{gate}.rollout.log", "w+b")  # noqa: SIM115 - closed by _end_server
    server = subprocess.Popen(layout.server_argv(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(work))
    seen.own(server.pid)
    return server, log


def _end_server(server: "subprocess.Popen[bytes]", log: IO[bytes], trainer_code: int | None) -> dict[str, Any]:
    """Wait for the server (the trainer's stop ends it); one left waiting for a trainer that failed is killed."""
    try:
        code: int | None = server.wait(30 if trainer_code == 0 else 3)
        killed = False
    except subprocess.TimeoutExpired:
        server.kill()
        code, killed = server.wait(), True
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    log.close()
    return {"argv": server.args, "pid": server.pid, "exit_code": code, "killed": killed,
            "error": m.last_error(text), "log_tail": text[-2000:]}


def run(settings: dict[str, Any], gate: str, extra: dict[str, Any] | None = None) -> tuple[Run, dict[str, Any], str]:
    """Run one arm under the gate's census (acceptance.census); returns the parsed Run, the facts of the run
    (argv, env, layout, the raw census) and the console tail."""
    arm_env, lr = arm_of(settings, gate)
    layout = Layout(settings, gate)
    work = Path(settings.get("work_dir", "/tmp/acceptance"))
    work.mkdir(parents=True, exist_ok=True)
    log_path = str(work / f"{gate}.jsonl")
    if os.path.exists(log_path):
        os.unlink(log_path)
    extra = dict(extra or {})
    if layout.split():
        extra[layout.rollout.get("address_key") or "actor_rollout_ref.rollout.address"] = layout.address
    argv, log_env = command(settings, lr, log_path, extra)
    records = work / f"{gate}.processes"
    env = _base_env(settings, arm_env, records, layout)
    env.update(log_env)
    console_path = work / f"{gate}.console.log"
    seen = _census(settings, records).start()  # before the first process of the run, stopped after the last
    server = None
    rollout: dict[str, Any] | None = None
    try:
        if layout.one_container():
            server = _start_server(layout, env, work, gate, seen)
        with open(console_path, "w+b") as out:
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=str(work))
            except OSError as err:
                if server is not None:
                    _end_server(*server, None)
                seen.stop()
                return (Run(exit_code=127, steps={}, source="none", error=str(err)), {"argv": argv, "error": str(err)},
                        str(err))
            seen.own(proc.pid)
            console = _stream(proc, out)
            code = proc.returncode
        if server is not None:
            rollout = _end_server(*server, code)
    finally:
        taken = seen.stop()
    file_text = Path(log_path).read_text("utf-8", "replace") if os.path.exists(log_path) else ""
    file_steps, problems = m.parse_jsonl(file_text)
    console_steps = m.parse_console(console)
    steps, source = m.merged(file_steps, console_steps)
    error = m.last_error(console) if code != 0 else None
    if rollout is not None and rollout["exit_code"] != 0 and code == 0:  # the engine's side failed the run
        code, error = 1, f"rollout server exited with {rollout['exit_code']}: {rollout['error']}"
    result = Run(exit_code=code, steps=steps, source=source, console=console_steps, problems=problems, error=error)
    facts = {"argv": argv, "lr": lr, "arm_env": dict(arm_env), "recipe_env": settings.get("env") or {},
             "file_log": log_path, "file_log_lines": len(file_text.splitlines()),
             "file_log_problems": problems[:5], "console_steps": sorted(console_steps), "processes_dir": str(records),
             "layout": {**layout.facts(), **({"rollout": rollout} if rollout else {})}, "census": taken}
    return result, facts, console[-TAIL:]


def serve(settings: dict[str, Any], gate: str) -> tuple[int | None, dict[str, Any], str]:
    """The rollout role of a gate (layout nodes 2, role rollout): the pins' rollout entry with the arm's env and
    the recording env, under the census, until the trainer sends stop. (exit code, facts, console tail)."""
    arm_env, _ = arm_of(settings, gate)
    layout = Layout(settings, gate)
    if layout.role != "rollout":
        raise ValueError("settings.layout: expected nodes 2 and role rollout for the rollout role")
    work = Path(settings.get("work_dir", "/tmp/acceptance"))
    work.mkdir(parents=True, exist_ok=True)
    records = work / f"{gate}.rollout.processes"
    env = _base_env(settings, arm_env, records, layout)
    node_env = {k: os.environ[k] for k in os.environ.get(NODE_ENV, "").split(",") if k and k in os.environ}
    env.update(node_env)  # a worker starts in its node's environment (as Ray's workers in their raylet's): it wins
    argv = layout.server_argv()
    seen = _census(settings, records).start()
    try:
        with open(work / f"{gate}.rollout.log", "w+b") as out:
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=str(work))
            except OSError as err:
                seen.stop()
                return 127, {"argv": argv, "error": str(err)}, str(err)
            seen.own(proc.pid)
            console = _stream(proc, out)
    finally:
        taken = seen.stop()
    facts = {"argv": argv, "arm_env": dict(arm_env), "recipe_env": settings.get("env") or {}, "node_env": node_env,
             "exit_code": proc.returncode, "error": m.last_error(console) if proc.returncode else None,
             "processes_dir": str(records), "layout": layout.facts(), "census": taken}
    return proc.returncode, facts, console[-TAIL:]
