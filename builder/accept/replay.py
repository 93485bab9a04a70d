"""Host side of replay bundles (acceptance/replay.py): the report links each recipe gate's bundle, written to
replay/<gate>.json in the run directory; `builder replay` runs only that comparison again in a fresh container
(network none) of the same image or another one, and says where the two sides still differ."""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from acceptance.replay import KINDS as KINDS  # re-exported: the report links the gates that keep bundles
from builder.accept.gates import TMPFS
from builder.accept.runner import last_json
from builder.core.constants import CACHE_ENV, LABEL_PREFIX
from builder.core.errors import BadInput, InfraError
from builder.core.records import GateResult
from builder.engine import client as engine
from builder.engine import containers
from builder.engine.client import Client
from builder.engine.containers import ContainerSpec

BUNDLE_PATH = "/opt/replay/bundle.json"  # outside the tmpfs mounts, so it is there when the container starts
LABEL = f"{LABEL_PREFIX}.replay"
REPLAY_TIMEOUT_S = 600  # one step on a captured batch


def bundle_file(gate: str) -> str:
    return f"replay/{gate}.json"


def split(gates: list[GateResult]) -> tuple[list[GateResult], dict[str, dict[str, Any]]]:
    """The gates as the report keeps them (a bundle's inline weights replaced by a pointer to its file) and
    the full bundles to write, by gate."""
    kept, files = [], {}
    for gate in gates:
        found = gate.evidence.get("replay")
        if gate.name not in KINDS or not isinstance(found, dict) or not found.get("differs") or "file" in found:
            kept.append(gate)  # no bundle, nothing differed, or already written (a report written again)
            continue
        files[gate.name] = found
        slim = {**found, "file": bundle_file(gate.name)}
        if isinstance(found.get("weights"), dict) and "data" in found["weights"]:
            slim["weights"] = {k: v for k, v in found["weights"].items() if k != "data"}
        kept.append(gate.model_copy(update={"evidence": {**gate.evidence, "replay": slim}}))
    return kept, files


def choose(gates: list[GateResult], gate: str | None, report_path: str) -> tuple[str, dict[str, Any]]:
    """(gate, its bundle summary in the report): the named gate, else the first that differed, else the first
    with a bundle. BadInput (exit 2) when there is none."""
    if gate is not None and gate not in KINDS:
        raise BadInput(f"--gate: expected one of {', '.join(KINDS)}, got {gate[:40]!r}")
    found = {g.name: g.evidence["replay"] for g in gates
             if g.name in KINDS and isinstance(g.evidence.get("replay"), dict)}
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


def load_bundle(run_dir: Path, gate: str) -> bytes:
    path = run_dir / bundle_file(gate)
    try:
        data = path.read_bytes()
        json.loads(data)
    except (OSError, ValueError) as err:
        raise BadInput(f"{path}: expected the replay bundle of {gate} written with the report ({err})") from None
    return data


def run(client: Client, image: str, python: str, bundle: bytes) -> dict[str, Any]:
    """`python -m acceptance replay` in a fresh network-none container of `image`; its result and the facts."""
    if engine.image_id(client, image) is None:
        raise BadInput(f"--image {image}: not found in the Docker engine")
    spec = ContainerSpec(image=image, command=[python, "-m", "acceptance", "replay", "--bundle", BUNDLE_PATH],
                         environment=dict(CACHE_ENV), tmpfs=dict(TMPFS), labels={LABEL: uuid.uuid4().hex[:12]},
                         files={BUNDLE_PATH: bundle})
    start = time.monotonic()
    done = containers.run(client, spec, REPLAY_TIMEOUT_S, "replay")
    seconds = round(time.monotonic() - start, 3)
    if done.timed_out:
        raise InfraError(f"replay: the container of {image} ran past {REPLAY_TIMEOUT_S} s and was killed")
    result = last_json(done.stdout)
    if result is None:
        tail = (done.stderr or done.stdout)[-300:].replace("\n", " ")
        raise InfraError(f"replay: the container of {image} exited {done.exit_code} without a result line: {tail}")
    return {**result, "exit_code": done.exit_code, "seconds": seconds, "network": done.facts.get("network"),
            "image": image}


def lines(gate: str, result: dict[str, Any]) -> list[str]:
    """What `builder replay` prints: the verdict, then the first differing position and both values."""
    if result.get("error"):
        return [f"{gate}: cannot replay: {result['error']}"]
    where = f"{gate} step {result.get('step')} ({result.get('kind')}, image {result.get('image')}," \
            f" {result.get('seconds')} s)"
    if not result.get("differs"):
        return [f"{where}: equal: no position differs"]
    out = [f"{where}: DIFFERS at {result.get('count')} position(s)"]
    first = (result.get("first") or [None])[0]
    if isinstance(first, dict):
        if "tensor" in first:
            out.append(f"first: {first['tensor']}[{first['index']}]: before {first['before']!r}, "
                       f"after {first['after']!r}")
        else:
            out.append(f"first: row {first['position'][0]} token {first['position'][1]}: trainer "
                       f"{first['trainer']!r}, rollout {first['rollout']!r}")
    if result.get("note"):
        out.append(str(result["note"]))
    return out
