"""`--slurm`: the candidate exported to .sqsh in the shared directory (from its staged digest or local
image ID), then every gate of the pins as a Slurm step from that .sqsh (builder/cluster/runner.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic

from builder.accept import gates
from builder.cluster.runner import SlurmOptions, SlurmRunner
from builder.core import log
from builder.core.errors import BadInput
from builder.core.imageref import by_digest, split_digest
from builder.core.options import Settings
from builder.core.records import AcceptanceResult
from builder.engine import client as engine
from builder.engine import staging
from builder.pins import model as pins_model
from builder.pins.model import Pins
from builder.release import sqsh


def options(pins: Pins, settings: Settings, flags: dict[str, Any] | None = None) -> SlurmOptions:
    """acceptance.slurm of the pins, each set CLI flag (partition, account, qos, time_limit_s,
    shared_dir, runtime) overriding it; GPUs per node from acceptance.gpus."""
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    try:  # a flag is checked by the same rules as the pins value it overrides
        s = pins_model.Slurm.model_validate({**pins.acceptance.slurm.model_dump(), **given})
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        name = str(first["loc"][0]).replace("_", "-") if first["loc"] else "slurm"
        raise BadInput(f"--slurm-{name}: {first['msg'].removeprefix('Value error, ')}") from None
    return SlurmOptions(shared_dir=Path(s.shared_dir) if s.shared_dir else settings.cache("cluster-images"),
                        partition=s.partition, account=s.account, qos=s.qos, time_limit_s=s.time_limit_s,
                        srun_args=list(s.srun_args), runtime=s.runtime, gpus=pins.acceptance.gpus)


def sqsh_path(opts: SlurmOptions, image_id: str) -> Path:
    """Named by image ID alone: runs of the same image (a nightly fleet) share one export."""
    return opts.shared_dir / f"candidate+{split_digest(image_id)[1][:16]}.sqsh"


def accept_on_slurm(pins: Pins, image: str, settings: Settings, opts: SlurmOptions, gate_names: list[str] | None,
                    timeout_s: int | None, expected_id: str | None = None) -> AcceptanceResult:
    client = engine.connect(settings)
    pulled = None
    staged = by_digest(image)
    if staged is not None:
        pulled = staging.pull(client, image, expected_id, settings)
        image_id = pulled.image_id
    else:
        found = engine.image_id(client, image)
        if found is None:
            raise BadInput(f"image {image}: not found in the Docker engine")
        image_id = found
    with log.step("export .sqsh (candidate)"):
        record = sqsh.export_candidate(image_id, sqsh_path(opts, image_id), settings, client, pins.base.image)
    runner = SlurmRunner(pins, Path(record.path), record.sha256, opts, gates.gate_runs(pins, gate_names))
    result = gates.accept_with(runner, image_id, pins, gates=gate_names, timeout_s=timeout_s, run_id=runner.run_id)
    result.pulled = pulled
    result.container["sqsh"] = {"path": record.path, "sha256": record.sha256, "size": record.size,
                                "image_id": record.image_id, "staged": image if pulled else None,
                                "compression": record.compression,
                                "reused_layers": int(record.seconds.get("reused layers", 0))}
    return result
