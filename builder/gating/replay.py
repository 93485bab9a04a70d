"""Host side of replay bundles (acceptance/replay.py): the report links each recipe gate's bundle, written to
replay/<gate>.json in the run directory; `builder replay` runs only that comparison again through the same door
as the gates (builder/runners/factory.py: a fresh container where the report's gates ran, or `--slurm`) and says
where the two sides still differ."""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import JsonValue, TypeAdapter

from acceptance.replay import KINDS as KINDS  # re-exported: the report links the gates that keep bundles
from builder.core.errors import BadInput
from builder.core.evidence import ReplaySummary
from builder.core.records import GateResult, Report

SUMMARY = TypeAdapter(ReplaySummary)


def bundle_file(gate: str) -> str:
    return f"replay/{gate}.json"


def split(gates: list[GateResult]) -> tuple[list[GateResult], dict[str, ReplaySummary]]:
    """The gates as the report keeps them (a bundle's inline weights replaced by a pointer to its file) and
    the full bundles to write, by gate."""
    kept, files = [], {}
    for gate in gates:
        found = gate.evidence.replay
        if gate.name not in KINDS or found is None or not found.get("differs") or "file" in found:
            kept.append(gate)  # no bundle, nothing differed, or already written (a report written again)
            continue
        files[gate.name] = found
        slim: ReplaySummary = {**found, "file": bundle_file(gate.name)}
        weights = found.get("weights")
        if weights is not None and "data" in weights:
            slim["weights"] = {k: v for k, v in weights.items() if k != "data"}
        kept.append(gate.model_copy(update={"evidence": gate.evidence.model_copy(update={"replay": slim})}))
    return kept, files


def choose(gates: list[GateResult], gate: str | None, report_path: str) -> tuple[str, ReplaySummary]:
    """(gate, its bundle summary in the report): the named gate, else the first that differed, else the first
    with a bundle. BadInput (exit 2) when there is none."""
    if gate is not None and gate not in KINDS:
        raise BadInput(f"--gate: expected one of {', '.join(KINDS)}, got {gate[:40]!r}")
    found = {g.name: g.evidence.replay for g in gates if g.name in KINDS and g.evidence.replay is not None}
    if gate is not None:
        if gate not in found:
            raise BadInput(f"{report_path}: no replay bundle for gate {gate} (it did not run, or its recipe writes "
                           "no capture)")
        return gate, found[gate]
    for name in KINDS:
        if name in found and found[name].get("differs"):
            return name, found[name]
    if not found:
        raise BadInput(f"{report_path}: no replay bundle for any of {', '.join(KINDS)}")
    name = next(iter(found))
    return name, found[name]


def load_bundle(run_dir: Path, gate: str) -> dict[str, JsonValue]:
    """The gate's bundle as the report wrote it; BadInput (exit 2) when it is missing or not a JSON object."""
    path = run_dir / bundle_file(gate)
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as err:
        raise BadInput(f"{path}: expected the replay bundle of {gate} written with the report ({err})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected the replay bundle of {gate} written with the report (a JSON object)")
    return data


def lines(gate: str, result: ReplaySummary) -> list[str]:
    """What `builder replay` prints: the verdict, then the first differing position and both values."""
    if result.get("error"):
        return [f"{gate}: cannot replay: {result['error']}"]
    where = f"{gate} step {result.get('step')} ({result.get('kind')}, image {result.get('image')}," \
            f" {result.get('seconds')} s)"
    if not result.get("differs"):
        return [f"{where}: equal: no position differs"]
    out = [f"{where}: DIFFERS at {result.get('count')} position(s)"]
    first = next(iter(result.get("first") or []), None)
    if first is not None:
        if "tensor" in first:
            out.append(f"first: {first.get('tensor')}[{first.get('index')}]: before {first.get('before')!r}, "
                       f"after {first.get('after')!r}")
        else:
            row, token = [*(first.get("position") or []), None, None][:2]
            out.append(f"first: row {row} token {token}: trainer {first.get('trainer')!r}, "
                       f"rollout {first.get('rollout')!r}")
    if result.get("note"):
        out.append(str(result["note"]))
    return out


def nothing_failed(report: Report) -> list[str]:
    """What `builder replay` of an ACCEPTED run prints: nothing failed; the control arm's difference is evidence."""
    out = [f"nothing failed: {report.verdict} (image {report.image_id}); no gate to replay"]
    control = next((g for g in report.gates if g.name == "control"), None)
    found = control.evidence.replay if control else None
    if found is not None and found.get("differs"):
        out.append(f"control: its difference ({found.get('kind')}, {found.get('count')} position(s) at step "
                   f"{found.get('step')}) is the expected evidence that the arms differ; replay it with --gate control")
    return out


def verdict(gate: str, summary: ReplaySummary, result: ReplaySummary) -> tuple[list[str], int]:
    """(lines, exit code) of a replay: a gate that must agree exits 1 while it differs; the control arm, which must
    differ, exits 0 when its difference reproduces exactly (the same count and first positions) and 1 otherwise."""
    out = lines(gate, result)
    if gate != "control":
        return out, 1 if result.get("differs") else 0
    same = bool(result.get("differs")) and result.get("count") == summary.get("count") and \
        (result.get("first") or [])[:1] == (summary.get("first") or [])[:1]
    out.append("control: the recorded difference reproduces exactly (expected: the arms differ)" if same else
               f"control: the recorded difference ({summary.get('count')} position(s)) did not reproduce")
    return out, 0 if same else 1
