"""What `builder publish` believes about a report: the evidence, never the verdict field.

`check(report, where)` runs before any registry or engine call and raises BadInput (exit 2) naming
the first thing an edited or inconsistent report gets wrong:
- a gate listed twice (top level or acceptance.gates), or the two copies disagreeing;
- `reasons` not empty while the verdict says ACCEPTED;
- the pins file (re-read from sources.pins_path) gone, invalid, or not the sha256 the report recorded;
- the pins' lock gone, unreadable, or not the sha256 the report recorded (`lock --upgrade` since the run);
- required_gates not the pins' (cut down after a failure), or name / repository / tags / commits /
  base image that the pins do not give;
- a required gate whose evidence does not show a pass when re-derived here (`derive`).
Once acceptance results are signed (issue 14), `check_signature` is where publish requires a valid
signature over them; it verifies a signed envelope when one is given.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from acceptance import perf as perf_rule
from builder.core.errors import BadInput
from builder.core.records import Evidence, GateResult, Report, number
from builder.core.safetext import show
from builder.lock import record
from builder.lock.record import Lock
from builder.pins import model as pins_mod
from builder.report.document import image_tags

Verifier = Callable[[dict[str, Any], Any, str], dict[str, Any]]


def _fail(where: str, field: str, text: str) -> BadInput:
    return BadInput(f"{where}: {field}: {text}; refusing to publish")



def _steps_zero(evidence: Evidence, steps: int) -> str | None:
    table = evidence.steps
    if not isinstance(table, dict):
        return "no per-step table"
    for step in range(1, steps + 1):
        row = table.get(str(step))
        if not isinstance(row, dict):
            return f"step {step} missing"
        for role in ("diff_max", "k3_kl"):
            value = number(row.get(role))
            if value is None or value != 0.0:
                return f"step {step}: {role} is {show(row.get(role))}, not exactly 0"
    return None


def _performance(ev: Evidence, spec: pins_mod.Performance | None) -> str | None:
    """The performance gate's rule again, on the evidence's runs with the pins' settings: min_pairs to repeats
    pairs, every run passing, and a pass on them."""
    if spec is None:
        return "the pins name no acceptance.performance"
    runs = [r for r in ev.runs or [] if isinstance(r, dict)]
    arms = {arm: [r for r in runs if r.get("arm") == arm] for arm in ("aligned", "control")}
    for arm, own in arms.items():
        if not spec.min_pairs <= len(own) <= spec.repeats or any(r.get("status") != "pass" for r in own):
            return (f"{arm}: expected {spec.min_pairs} to {spec.repeats} passing runs, got "
                    f"{show([r.get('status') for r in own])}")
    status, reason, _ = perf_rule.decide(arms["aligned"], arms["control"], spec.rule())
    return None if status == "pass" else f"the runs read {status}: {reason}"


def derive(gate: GateResult, steps: int, performance: pins_mod.Performance | None = None) -> str | None:
    """Why the evidence of a gate reading `pass` does not show a pass (None when it does)."""
    ev = gate.evidence
    if gate.name == "performance":
        return _performance(ev, performance)
    if gate.name == "provenance":
        failures = ev.failures
        return None if failures == [] else f"failures is {show(failures)}, not an empty list"
    if ev.exit_code != 0 or isinstance(ev.exit_code, bool):
        return f"exit_code is {show(ev.exit_code)}, not 0"
    if gate.name == "zero_update":
        weights = ev.weights
        if not isinstance(weights, list) or len(weights) != 1:
            return f"weights {show(weights)}: expected one checksum (unchanged with lr 0)"
        return _steps_zero(ev, steps)
    if gate.name == "rl_step":
        why = _steps_zero(ev, steps)
        if why:
            return why
        table = ev.steps or {}
        for step in range(1, steps + 1):
            for role in ("reward", "loss"):
                value = number(table[str(step)].get(role))
                if value is None or not math.isfinite(value):
                    return f"step {step}: {role} is {show(table[str(step)].get(role))}, not a finite number"
        first = table["1"]
        before, after = first.get("weights_before"), first.get("weights_after")
        if before is None or after is None or before == after:
            return f"step 1 weights {show(before)} -> {show(after)}: expected a change with lr > 0"
        return None
    if gate.name == "control":
        value = number(ev.diff_max)
        if value is None or not math.isfinite(value) or value <= 0:
            return f"diff_max is {show(ev.diff_max)}: the control arm must show a mismatch > 0"
        return None
    return f"no rule to re-derive gate {show(gate.name)}"


def _gates(report: Report, where: str) -> dict[str, GateResult]:
    """The acceptance result's gates by name, after checking both lists for duplicates and disagreement."""
    acceptance = report.acceptance
    if acceptance is None:
        raise _fail(where, "acceptance", "no acceptance result")
    for field, gates in (("gates", report.gates), ("acceptance.gates", acceptance.gates)):
        twice = [name for name, n in Counter(g.name for g in gates).items() if n > 1]
        if twice:
            raise _fail(where, field, f"gate {show(twice[0])} is listed more than once")
    ran = {g.name: g for g in acceptance.gates}
    for gate in report.gates:
        copy = ran.get(gate.name)
        if copy is None:
            if gate.status != "not_run":
                raise _fail(where, "gates", f"gate {show(gate.name)} reads {gate.status} but acceptance.gates"
                            " has no such gate")
        elif copy.model_dump() != gate.model_dump():
            raise _fail(where, "gates", f"gate {show(gate.name)} disagrees with acceptance.gates"
                        f" ({gate.status} vs {copy.status})")
    missing = sorted(set(ran) - {g.name for g in report.gates})
    if missing:
        raise _fail(where, "gates", f"gate {show(missing[0])} of acceptance.gates is missing")
    return ran


def _pins(report: Report, where: str) -> pins_mod.Pins:
    path = report.sources.pins_path
    try:
        pins = pins_mod.load(path)
    except BadInput as exc:
        raise _fail(where, "sources.pins_path", f"the pins file cannot be re-read ({exc})") from None
    run = report.run_manifest.run
    recorded = {report.sources.pins_sha256, report.sources.pins_sha256 if run.pins_sha256 == "unknown"
                else run.pins_sha256}
    if recorded != {pins.sha256}:
        raise _fail(where, "sources.pins_sha256", f"{show(path, 80)} now has sha256 {pins.sha256[:16]}...,"
                    " not the one the report recorded")
    return pins


def _lock(report: Report, pins: pins_mod.Pins, where: str) -> Lock:
    """The pins' lock, read once here for publish and attest, and the one the run used (its sha256)."""
    try:
        lock = record.of(pins)
    except BadInput as exc:
        raise _fail(where, "lock_sha256", f"the lock cannot be re-read ({exc})") from None
    run = report.run_manifest.run
    recorded = {report.lock_sha256, report.lock_sha256 if run.lock_sha256 == "unknown" else run.lock_sha256}
    if recorded != {lock.sha256}:
        raise _fail(where, "lock_sha256", f"{show(str(lock.path), 80)} now has sha256 {lock.sha256[:16]}...,"
                    " not the one the report recorded")
    return lock


def _identity(report: Report, pins: pins_mod.Pins, where: str) -> None:

    want = {"name": pins.name, "repository": pins.image.repository, "tags": image_tags(pins),
            "base_image": pins.base.image, "platform": pins.base.platform}
    for field, value in want.items():
        if getattr(report, field) != value:
            raise _fail(where, field, f"{show(getattr(report, field))} is not what the pins give ({show(value)})")
    shared = report.run_manifest.run.components_shared
    if pins.shared and shared != list(pins.shared):
        raise _fail(where, "run_manifest.run.components_shared", f"{show(shared)} does not show the pins'"
                    f" shared {show(list(pins.shared))}")
    for name, comp in pins.components.items():
        got = report.sources.components.get(name)
        if got is None or got.commit != comp.commit:
            raise _fail(where, f"sources.components.{name}.commit",
                        f"{show(got.commit if got else None)} is not the pinned {comp.commit}")


def check(report: Report, where: str) -> tuple[pins_mod.Pins, Lock] | None:
    """Refuse an ACCEPTED report that its own evidence, the pins file and its lock do not support; return
    the pins and the lock (read once, here).
    A report that does not claim ACCEPTED is left to publish's own refusal (exit 1)."""
    if report.verdict != "ACCEPTED":
        return None
    if report.reasons:
        raise _fail(where, "reasons", f"verdict ACCEPTED with reasons {show(report.reasons[0])}")
    ran = _gates(report, where)
    pins = _pins(report, where)
    lock = _lock(report, pins, where)
    required = list(pins.acceptance.required_gates)
    if report.required_gates != required:
        cut = [g for g in required if g not in report.required_gates]
        what = f"drops {', '.join(cut)}" if cut else f"is {show(report.required_gates)}"
        raise _fail(where, "required_gates", f"{what}; the pins require {', '.join(required)}")
    _identity(report, pins, where)
    acc = report.acceptance
    if (acc is not None and acc.image_id != report.image_id) or (report.build and report.build.image_id != report.image_id):
        raise _fail(where, "image_id", "build, acceptance and report name different images")
    for name in required:
        gate = ran.get(name)
        if gate is None or gate.status != "pass":
            raise _fail(where, f"acceptance.gates.{name}",
                        f"required gate reads {gate.status if gate else 'not run'}, not pass")
        why = derive(gate, pins.acceptance.steps, pins.acceptance.performance)
        if why:
            raise _fail(where, f"acceptance.gates.{name}.evidence", f"does not support pass: {why}")
    return pins, lock


def check_signature(report: Report, where: str, envelope: dict[str, Any] | None, public_key: Any,
                    verify: Verifier | None) -> dict[str, Any] | None:
    """Issue 14 hook: with a signed in-toto test result (`envelope`) and its verifier
    (builder.release.attest.verify_test_result(envelope, public_key, digest)), the signature must hold for this
    image and read PASSED; returns its predicate. `envelope=None` and `verify=None` (signing not set up) return None."""
    if envelope is None and verify is None:
        return None
    if envelope is None or verify is None or public_key is None:
        raise _fail(where, "test result signature", "signing is set up but the signed test result,"
                    " its verifier or the public key is missing")
    try:
        predicate = verify(envelope, public_key, report.image_id)
    except Exception as exc:  # the verifier's own error type names the failed check
        raise _fail(where, "test result signature", str(exc)) from None
    if predicate.get("result") != "PASSED":
        raise _fail(where, "test result signature", f"signed result is {show(predicate.get('result'))}")
    return predicate
