"""Where gates run: one small interface, two implementations (the Docker engine here, Slurm with an HPC
container runtime, both in builder/runners/). The gate loop drives a GateRunner and never learns which one ran.

Every call runs `<python> -m acceptance gate <gate> --settings <json>` in a fresh container of the candidate
image (read-only; nothing carries over between calls but the gate's own output directory); the gate's
GateResult is the last line it prints on stdout. The runner gets a typed call (builder/gating/settings.py) and
makes its JSON where it leaves the process: the command, or a file the command names."""
from __future__ import annotations

import json
from typing import Any, Protocol

from builder.core.records import DockerFacts, Evidence, GateResult, SlurmFacts
from builder.gating.settings import Call
from builder.pins.model import Pins

TAIL = 6000  # characters of a gate's output kept in its result


SETTINGS_FILE = "/opt/replay/settings.json"  # settings too long for one argument (a replay bundle) travel as a file
ARG_MAX = 64 * 1024                           # one argv string may hold 128 KiB (MAX_ARG_STRLEN); stay well below


class GateRunner(Protocol):
    kind: str  # a display name; only the runners and builder/runners/factory.py know the kinds
    run_id: str

    def run(self, call: Call, timeout_s: int) -> tuple[GateResult, dict[str, Any]]:
        """Run one gate in a fresh container; its result and the facts of where and how it ran."""
        ...

    def describe(self) -> DockerFacts | SlurmFacts:
        """For the report: the engine or runtime and its version, and the isolation the gates really had (the gate
        loop adds the run's own facts: image, run id, limits, mounts, per-gate facts)."""
        ...

    def close(self) -> None:
        """Remove or cancel whatever of this runner's work is still there (also on interrupt)."""
        ...


def gate_command(pins: Pins, gate: str, settings: str) -> list[str]:
    """The in-image command of one gate: `settings` is its wire JSON inline, or `@FILE` where the runner put it."""
    return [pins.base.python_bin, "-m", "acceptance", "gate", gate, "--settings", settings]


def last_json(stdout: str) -> dict[str, Any] | None:
    """The last non-empty stdout line when it is a JSON object (how the in-image commands answer)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def parse_result(stdout: str, gate: str) -> dict[str, Any] | None:
    """The gate's result: the last non-empty stdout line, a JSON object naming the gate."""
    data = last_json(stdout)
    return data if data is not None and data.get("name") == gate else None


def result_from_output(gate: str, exit_code: int | None, stdout: str, stderr: str, timed_out: bool,
                       timeout_s: int, killed_by: str = "container killed") -> GateResult:
    """A GateResult from what one gate run printed: a timeout fails naming the limit, a run without a
    result line fails naming its exit status, otherwise the gate's own result (with its log tail)."""
    if timed_out:
        return GateResult(name=gate, status="fail", reason=f"timed out after {timeout_s} s ({killed_by})",
                          evidence=Evidence(timeout_s=timeout_s), log=(stderr + stdout)[-TAIL:])
    data = parse_result(stdout, gate)
    if data is None:
        return GateResult(name=gate, status="fail",
                          reason=f"gate exited with status {exit_code} without a result line",
                          evidence=Evidence(exit_code=exit_code), log=(stderr + stdout)[-TAIL:])
    data["log"] = data.get("log") or stderr[-TAIL:]
    return GateResult.model_validate({k: data.get(k) for k in ("name", "status", "reason", "evidence", "log")})
