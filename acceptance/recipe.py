"""Run the recipe once (one arm) and parse what it logged; never imports the components."""
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

from acceptance import metrics as m
from acceptance import processes
from acceptance.decide import Run

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


def run(settings: dict[str, Any], gate: str, extra: dict[str, Any] | None = None) -> tuple[Run, dict[str, Any], str]:
    """Run one arm; returns the parsed Run, the facts of the run (argv, env) and the console tail."""
    arm_env, lr = arm(settings, gate)
    work = Path(settings.get("work_dir", "/tmp/acceptance"))
    work.mkdir(parents=True, exist_ok=True)
    log_path = str(work / f"{gate}.jsonl")
    if os.path.exists(log_path):
        os.unlink(log_path)
    argv, log_env = command(settings, lr, log_path, extra)
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (settings.get("env") or {}).items()})
    env.update({k: str(v) for k, v in arm_env.items()})
    env.update(log_env)
    records = work / f"{gate}.processes"  # every Python process of the run records itself here (acceptance.hook)
    shutil.rmtree(records, ignore_errors=True)
    env.update(processes.recording_env(settings, str(records)))
    console_path = work / f"{gate}.console.log"
    with open(console_path, "w+b") as out:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=str(work))
        except OSError as err:
            return (Run(exit_code=127, steps={}, source="none", error=str(err)), {"argv": argv, "error": str(err)},
                    str(err))
        stdout = cast(io.BufferedReader, proc.stdout)  # stdout=PIPE with the default buffering
        for chunk in iter(lambda: stdout.read1(65536), b""):
            out.write(chunk)
            sys.stderr.buffer.write(chunk)  # the container log shows the run as it goes
            sys.stderr.flush()
        code = proc.wait()
        out.seek(0)
        console = out.read().decode("utf-8", "replace")
    file_text = Path(log_path).read_text("utf-8", "replace") if os.path.exists(log_path) else ""
    file_steps, problems = m.parse_jsonl(file_text)
    console_steps = m.parse_console(console)
    steps, source = m.merged(file_steps, console_steps)
    result = Run(exit_code=code, steps=steps, source=source, console=console_steps, problems=problems,
                 error=m.last_error(console) if code != 0 else None)
    facts = {"argv": argv, "lr": lr, "arm_env": dict(arm_env), "recipe_env": settings.get("env") or {},
             "file_log": log_path, "file_log_lines": len(file_text.splitlines()),
             "file_log_problems": problems[:5], "console_steps": sorted(console_steps), "processes_dir": str(records)}
    return result, facts, console[-TAIL:]
