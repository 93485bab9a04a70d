"""Which gates an acceptance runs (builder/gating/gates.py): the ones asked for with --gate, else exactly the pins'
required gates; every other gate is reported not_run with why, and a Slurm allocation is sized for the same set."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.core.constants import GATES
from builder.core.options import Settings
from builder.core.records import DockerFacts, Evidence, GateResult
from builder.gating import gates, plan
from builder.gating.settings import Call
from builder.pins import model

ROOT = Path(__file__).resolve().parents[2]


class Recording:
    """A GateRunner that runs nothing: it records which gates it was asked for, and each one passes."""

    kind = "recording"
    run_id = "r0"

    def __init__(self) -> None:
        self.ran: list[str] = []

    def run(self, call: Call, timeout_s: int) -> tuple[GateResult, dict[str, Any]]:
        self.ran.append(call.gate)
        return GateResult(name=call.gate, status="pass", reason="recorded", evidence=Evidence()), {}

    def describe(self) -> DockerFacts:
        return DockerFacts(runner=self.kind)

    def close(self) -> None:
        """Nothing to remove."""


def _pins(required: list[str]) -> model.Pins:
    pins = model.load(ROOT / "pins" / "demo.yaml")
    return pins.model_copy(update={"acceptance": pins.acceptance.model_copy(
        update={"required_gates": required, "performance": None})})


def test_by_default_exactly_the_required_gates_run_and_the_others_say_why_not() -> None:
    runner = Recording()
    pins = _pins(["rl_step", "provenance"])
    made = plan.make(pins, plan.Flags(), Settings.from_env()).acceptance
    result = gates.run_gates(runner, "sha256:" + "a" * 64, made, pins)
    assert runner.ran == ["provenance", "rl_step"]  # in the gates' own order
    status = {g.name: (g.status, g.reason) for g in result.gates}
    assert [n for n, (s, _) in status.items() if s == "not_run"] == ["zero_update", "control", "performance"]
    assert all("acceptance.required_gates" in why for s, why in status.values() if s == "not_run")
    assert sum(g.runs for g in made.gates) == 2


def test_gates_asked_for_run_whatever_the_pins_require() -> None:
    runner = Recording()
    pins = _pins(["provenance"])
    made = plan.make(pins, plan.Flags(gates=["control", "zero_update"]), Settings.from_env()).acceptance
    result = gates.run_gates(runner, "sha256:" + "a" * 64, made, pins)
    assert runner.ran == ["zero_update", "control"]
    assert {g.name: g.reason for g in result.gates if g.status == "not_run"} == {
        g: "not selected" for g in GATES if g not in ("zero_update", "control")}
    assert sum(g.runs for g in made.gates) == 2 and result.where.limits.gate_timeout_s == {
        "zero_update": pins.acceptance.timeout_s, "control": pins.acceptance.timeout_s}
