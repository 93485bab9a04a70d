"""The acceptance settings as one frozen value read once from the pins (builder/gating/settings.py): the gate loop
reads its fields; `wire(gate)` is what the in-image suite reads, the same JSON images built before expect
(tests/data/gate_settings.json: written by the dict-building code it replaced). The command's plan holds its
flags instead of repeating them."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import MappingProxyType

import pytest

from builder.core.constants import GATES
from builder.core.options import Settings
from builder.gating import plan
from builder.gating.settings import GateSettings
from builder.pins import model as pins_mod

ROOT = Path(__file__).resolve().parents[2]
WIRE = json.loads((ROOT / "tests" / "data" / "gate_settings.json").read_text())


@pytest.mark.parametrize("name", sorted(WIRE))
def test_the_wire_is_what_the_in_image_suite_read_before(name: str) -> None:
    typed = GateSettings.of(pins_mod.load(ROOT / "pins" / name))
    assert {gate: typed.wire(gate) for gate in GATES} == WIRE[name]


def test_the_loop_reads_typed_fields_and_the_value_is_frozen() -> None:
    pins = pins_mod.load(ROOT / "pins" / "demo.yaml")
    typed = GateSettings.of(pins)
    perf = pins.acceptance.performance
    assert typed.performance is not None and perf is not None
    assert (typed.performance.repeats, typed.performance.min_pairs) == (perf.repeats, perf.min_pairs)
    assert typed.performance.rule == perf.rule() and typed.performance.steps == (perf.steps or pins.acceptance.steps)
    assert (typed.steps, typed.timeout_s, typed.nodes) == (pins.acceptance.steps, pins.acceptance.timeout_s, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.steps = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        typed.recipe["lr"] = 0  # type: ignore[index]


def test_the_plan_holds_the_flags_it_was_made_from(tmp_path: Path) -> None:
    pins = pins_mod.load(ROOT / "pins" / "demo.yaml")
    key = tmp_path / "k.key"
    settings = dataclasses.replace(Settings.from_env(), signing_key=key)
    made = plan.make(pins, plan.Flags(offline=True, publish=True, gates=["provenance"]), settings)
    assert made.flags.offline and made.flags.publish and made.flags.key == key  # the settings' key by default
    assert made.acceptance.gate("provenance").run and not made.acceptance.gate("rl_step").run
    own = tmp_path / "own.key"
    assert plan.make(pins, plan.Flags(key=own), settings).flags.key == own


def test_a_runner_gets_a_typed_call_and_its_json_is_made_where_it_leaves() -> None:
    """A performance run is the gate's wire with its steps and arm; a replay names only its bundle; the Docker
    container's command carries exactly the call's wire (a file it names when too long), nothing added by the runner."""
    from builder.gating.runner import ARG_MAX, SETTINGS_FILE
    from builder.gating.settings import GateCall, ReplayCall
    from builder.runners.docker_runner import container_spec

    pins = pins_mod.load(ROOT / "pins" / "demo.yaml")
    typed = GateSettings.of(pins)
    assert typed.performance is not None
    arm = GateCall("performance", typed, "control").wire()
    assert arm == {**typed.wire("performance"), "steps": typed.performance.steps, "arm": "control"}
    assert GateCall("rl_step", typed).wire() == typed.wire("rl_step")
    assert GateCall("rl_step", typed, census=False).wire() == {**typed.wire("rl_step"), "census": False}
    spec = container_spec(pins, "sha256:" + "ab" * 32, GateCall("performance", typed, "aligned"), "r1")
    assert json.loads(spec.command[-1]) == {**arm, "arm": "aligned"} and not spec.files
    replay = ReplayCall(MappingProxyType({"blob": "x" * ARG_MAX}), 60)
    big = container_spec(pins, "sha256:" + "ab" * 32, replay, "r1")
    assert big.command[-3:] == ["replay", "--settings", f"@{SETTINGS_FILE}"]
    assert json.loads(big.files[SETTINGS_FILE]) == {"bundle": {"blob": "x" * ARG_MAX}, "timeout_s": 60,
                                                    "work_dir": "/tmp/acceptance"}
