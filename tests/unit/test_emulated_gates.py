"""An image of another architecture on the local engine runs emulated (binfmt): only provenance runs there, and every
recipe gate reads not_run "needs a native <arch> node", never pass (builder/gating/plan.py, engine/platforms.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.options import Settings
from builder.core.records import GateResult
from builder.engine import platforms
from builder.gating import gates, plan
from builder.pins import model
from builder.report import document
from tests.unit.test_gate_selection import Recording

ROOT = Path(__file__).resolve().parents[2]
FOREIGN = "linux/arm64" if platforms.host_architecture() == "amd64" else "linux/amd64"


def _pins(platform: str, required: list[str]) -> model.Pins:
    pins = model.load(ROOT / "pins" / "demo.yaml")
    return pins.model_copy(update={
        "base": pins.base.model_copy(update={"platform": platform}),
        "acceptance": pins.acceptance.model_copy(update={"required_gates": required, "performance": None})})


def _accept(pins: model.Pins, flags: plan.Flags) -> tuple[Recording, list[GateResult]]:
    runner = Recording()
    made = plan.make(pins, flags, Settings.from_env()).acceptance
    return runner, gates.run_gates(runner, "sha256:" + "a" * 64, made, pins).gates


def test_an_emulated_member_runs_provenance_only_and_says_which_gates_need_a_native_node() -> None:
    arch = FOREIGN.split("/")[1]
    runner, results = _accept(_pins(FOREIGN, ["provenance"]), plan.Flags())
    assert runner.ran == ["provenance"]
    others = [g for g in results if g.name != "provenance"]
    assert others and all(g.status == "not_run" for g in others)
    assert all(g.reason.startswith(f"needs a native {arch} node") for g in others)


@pytest.mark.parametrize("flags", [plan.Flags(), plan.Flags(gates=["rl_step", "provenance"])])
def test_a_required_or_asked_recipe_gate_is_not_run_emulated_and_the_verdict_is_not_accepted(flags: plan.Flags) -> None:
    required = ["provenance", "rl_step"]
    runner, results = _accept(_pins(FOREIGN, required), flags)
    assert runner.ran == ["provenance"]
    rl_step = next(g for g in results if g.name == "rl_step")
    assert rl_step.status == "not_run" and "needs a native" in rl_step.reason
    reasons = document.verdict_reasons(results, required, None, None, None, None)  # type: ignore[arg-type]
    assert any(r.startswith("required gate rl_step: not run (needs a native") for r in reasons)


def test_the_host_platform_and_the_cluster_run_the_recipe_gates() -> None:
    host = f"linux/{platforms.host_architecture()}"
    runner, _ = _accept(_pins(host, ["provenance", "rl_step"]), plan.Flags())
    assert runner.ran == ["provenance", "rl_step"]
    pins = _pins(FOREIGN, ["provenance", "rl_step"])
    on_cluster = plan.make(pins, plan.Flags(slurm=True), Settings.from_env()).acceptance
    assert [g.name for g in on_cluster.gates if g.run] == ["provenance", "rl_step"]  # the nodes run it natively


def test_binfmt_decides_what_runs_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platforms, "BINFMT", tmp_path)
    machine = platforms.MACHINES[FOREIGN.split("/")[1]]
    assert platforms.runs_here(platforms.MACHINES[platforms.host_architecture()])
    assert not platforms.runs_here(machine)
    (tmp_path / f"qemu-{machine}").write_text("disabled\ninterpreter /usr/libexec/qemu-binfmt/x\n")
    assert not platforms.runs_here(machine)
    (tmp_path / f"qemu-{machine}").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/x\nflags: OCF\n")
    assert platforms.runs_here(machine)
