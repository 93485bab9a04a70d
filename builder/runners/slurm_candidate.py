"""`--slurm`: the candidate exported to .sqsh in the shared directory (from its staged digest or local
image ID), then every gate of the plan as a Slurm step from that .sqsh (builder/runners/slurm_runner.py)."""
from __future__ import annotations

from pathlib import Path

from builder.core import log
from builder.core.errors import BadInput
from builder.core.imageref import by_digest, split_digest
from builder.core.options import Settings
from builder.core.records import Pulled, SqshFacts
from builder.engine import client as engine
from builder.engine import staging
from builder.engine.client import Client
from builder.gating.plan import AcceptancePlan, SlurmPlace
from builder.gating.runner import GateRunner
from builder.pins.model import Pins
from builder.release import sqsh
from builder.runners.slurm_runner import SlurmRunner


def sqsh_path(place: SlurmPlace, image_id: str) -> Path:
    """Named by image ID alone: runs of the same image (a nightly fleet) share one export."""
    return place.shared_dir / f"candidate+{split_digest(image_id)[1][:16]}.sqsh"


def open_slurm_runner(plan: AcceptancePlan, pins: Pins, image: str, expected_id: str | None, settings: Settings,
                client: Client) -> tuple[GateRunner, str, Pulled | None]:
    """Pull the staged digest (or find the local image), export its .sqsh once, and the Slurm runner on it."""
    assert isinstance(plan.place, SlurmPlace)
    pulled = None
    if by_digest(image) is not None:
        pulled = staging.pull(client, image, expected_id, settings)
        image_id = pulled.image_id
    else:
        found = engine.image_id(client, image)
        if found is None:
            raise BadInput(f"image {image}: not found in the Docker engine")
        image_id = found
    with log.step("export .sqsh (candidate)"):
        record = sqsh.export_candidate(image_id, sqsh_path(plan.place, image_id), settings, client, pins.base.image)
    facts = SqshFacts(path=record.path, sha256=record.sha256, size=record.size, image_id=record.image_id,
                      staged=image if pulled else None, compression=record.compression,
                      reused_layers=int(record.seconds.get("reused layers", 0)))
    return SlurmRunner(pins, plan, facts), image_id, pulled
