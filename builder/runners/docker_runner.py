"""The Docker engine as a GateRunner: one fresh container per gate from the image ID, with no network, no
host sources, empty tmpfs caches and read-only mounts only where the pins ask; killed at the timeout and
always removed. Beside each recipe gate runs a census container of the same image in the gate's pid namespace: its
fanotify reader (acceptance/fanotify.py) sees every exec of the gate, however short, and writes what it saw to a
tmpfs volume the gate mounts read-only (docs/gates.md "Short processes"). Everything Docker goes through
builder/engine."""
from __future__ import annotations

import json
import uuid
from typing import Any

from builder.core.constants import CACHE_DIR as CACHE
from builder.core.constants import CACHE_ENV, LABEL_PREFIX
from builder.core.errors import BadInput
from builder.core.records import DockerFacts, GateResult
from builder.engine import client as engine
from builder.engine import containers
from builder.engine.client import Client
from builder.engine.containers import Bind, ContainerSpec, Volume
from builder.gating.runner import ARG_MAX, SETTINGS_FILE, gate_command, result_from_output
from builder.gating.settings import Call, GateCall
from builder.pins.model import Pins, check_mounts

LABEL = f"{LABEL_PREFIX}.acceptance"          # value: the run id; on every acceptance container
TMPFS = {CACHE: "rw,exec,nosuid,nodev,size=2g", "/tmp": "rw,exec,nosuid,nodev,size=1g"}
CENSUS_DIR = "/census"                       # the census volume: the reader writes, the gate reads
CENSUS_EVENTS = f"{CENSUS_DIR}/events.jsonl"
# fanotify_init with FAN_CLASS_CONTENT and mount marks need CAP_SYS_ADMIN (initial user namespace); reading the
# gate's /proc/<pid> of any process whatever its capabilities needs CAP_SYS_PTRACE; nothing else is kept
CENSUS_CAPS = ["SYS_ADMIN", "SYS_PTRACE"]
NOT_RECIPE = ("provenance", "replay")


def census_spec(pins: Pins, image_id: str, volume: str, labels: dict[str, str]) -> ContainerSpec:
    """The census container: the same image (no other exists offline), network none, read-only, every capability
    dropped but CENSUS_CAPS, no new privileges, the census volume its only writable place."""
    return ContainerSpec(image=image_id, command=[pins.base.python_bin, "-m", "acceptance.fanotify", "--pid", "1",
                                                  "--out", CENSUS_EVENTS],
                         volumes=[Volume(volume, CENSUS_DIR)], cap_add=list(CENSUS_CAPS), cap_drop=["ALL"],
                         read_only=True, working_dir="/", labels={**labels, f"{LABEL}.census": "1"})


def container_spec(pins: Pins, image_id: str, call: Call, run_id: str, census: str | None = None) -> ContainerSpec:
    """The gate's container: network none, tmpfs caches, the pins' read-only mounts, the checkpoint scratch; the
    call's settings inline, or in a file the command names when too long for one argument. `census`: the census
    volume, mounted read-only, its events file named in the settings (census_events)."""
    binds = [Bind(m.source, m.target) for m in pins.acceptance.mounts]
    ckpt = pins.acceptance.checkpoint
    if pins.acceptance.weights == "checkpoint" and ckpt is not None and ckpt.scratch:
        # the only writable mount: where the recipe saves its checkpoints (pins: acceptance.checkpoint.scratch)
        binds.append(Bind(ckpt.scratch, ckpt.dir, read_only=False))
    wire = call.wire()
    if census is not None:
        wire["census_events"] = CENSUS_EVENTS
    gate, text = call.gate, json.dumps(wire)
    big = len(text) > ARG_MAX
    return ContainerSpec(image=image_id, command=gate_command(pins, gate, f"@{SETTINGS_FILE}" if big else text),
                         environment=dict(CACHE_ENV), tmpfs=dict(TMPFS), binds=binds, working_dir="/tmp",
                         gpus=pins.acceptance.gpus, files={SETTINGS_FILE: text.encode()} if big else {},
                         volumes=[Volume(census, CENSUS_DIR, read_only=True)] if census else [],
                         labels={LABEL: run_id, f"{LABEL}.gate": gate, f"{LABEL}.image": image_id})


class DockerRunner:
    """Gates in fresh containers of one image on one engine."""

    kind = "docker"

    def __init__(self, client: Client, pins: Pins, image_id: str, run_id: str) -> None:
        self.client, self.pins, self.image_id, self.run_id = client, pins, image_id, run_id

    def run(self, call: Call, timeout_s: int) -> tuple[GateResult, dict[str, Any]]:
        census = isinstance(call, GateCall) and call.census and call.gate not in NOT_RECIPE
        volume = None
        try:
            if census:
                volume = containers.tmpfs_volume(self.client, f"builder-census-{uuid.uuid4().hex[:12]}",
                                                 {LABEL: self.run_id})
            spec = container_spec(self.pins, self.image_id, call, self.run_id, volume)
            beside = census_spec(self.pins, self.image_id, volume, spec.labels) if volume else None
            out = containers.run(self.client, spec, timeout_s, call.gate, beside)
        finally:
            if volume is not None:
                containers.remove_volume(self.client, volume)
        result = result_from_output(call.gate, out.exit_code, out.stdout, out.stderr, out.timed_out, timeout_s)
        return result, out.facts

    def describe(self) -> DockerFacts:
        return DockerFacts(runner=self.kind, engine=engine.engine_version(self.client), network="none",
                           home="tmpfs (HOME is the empty cache tmpfs)", label=f"{LABEL}={self.run_id}",
                           tmpfs=TMPFS, env=CACHE_ENV)

    def close(self) -> None:
        for container_id in containers.labelled(self.client, f"{LABEL}={self.run_id}"):
            containers.remove(self.client, container_id)
        for volume in containers.labelled_volumes(self.client, f"{LABEL}={self.run_id}"):
            containers.remove_volume(self.client, volume)


def for_image(client: Client, pins: Pins, image: str, run_id: str | None = None) -> tuple[DockerRunner, str]:
    """The runner of an image this engine has, and its full ID; BadInput when the pins' mounts would expose the
    engine's data root or the engine has no such image. `run_id` labels its containers (default: a fresh one)."""
    check_mounts(pins, engine.facts(client).get("data_root"))  # the engine's own data root, wherever it is
    full_id = engine.image_id(client, image)
    if full_id is None:
        raise BadInput(f"image {image}: not found in the Docker engine")
    return DockerRunner(client, pins, full_id, run_id or uuid.uuid4().hex[:12]), full_id


def leftover_containers(client: Client, run_id: str | None = None) -> list[str]:
    """Acceptance containers still present (all runs, or one run)."""
    return containers.labelled(client, f"{LABEL}={run_id}" if run_id else LABEL)
