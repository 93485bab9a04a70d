"""Where gates run (provisional copy of the coordinator's interface, RUNNER.md; main's version wins)."""
from __future__ import annotations

import json
from typing import Any, Protocol

from builder.core.records import GateResult
from builder.pins.model import Pins

TAIL = 6000


class GateRunner(Protocol):
    kind: str

    def run(self, gate: str, settings: dict[str, Any], timeout_s: int) -> tuple[GateResult, dict[str, Any]]: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def gate_command(pins: Pins, gate: str, settings: dict[str, Any]) -> list[str]:
    return [pins.base.python_bin, "-m", "acceptance", "gate", gate, "--settings", json.dumps(settings)]


def _parse(stdout: str, gate: str) -> dict[str, Any] | None:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("name") == gate else None


def result_from_output(gate: str, exit_code: int | None, stdout: str, stderr: str, timed_out: bool,
                       timeout_s: int) -> GateResult:
    if timed_out:
        return GateResult(name=gate, status="fail", reason=f"timed out after {timeout_s} s",
                          evidence={"timeout_s": timeout_s}, log=(stderr + stdout)[-TAIL:])
    data = _parse(stdout, gate)
    if data is None:
        return GateResult(name=gate, status="fail", reason=f"gate exited with status {exit_code} without a result line",
                          evidence={"exit_code": exit_code}, log=(stderr + stdout)[-TAIL:])
    data["log"] = data.get("log") or stderr[-TAIL:]
    return GateResult.model_validate({k: data.get(k) for k in ("name", "status", "reason", "evidence", "log")})
