"""The final smoke of a converted image: the provenance gate on the root filesystem unpacked from the .sqsh
(the read-back the file-by-file check made), in a fresh read-only runc container straight from that directory
(builder/runners/runc_runner.py: network none, tmpfs /tmp and cache, the environment the tree's /etc/environment
gives, as enroot applies it at start). Nothing is imported into the Docker engine: importing the tree of a 1 GB
image cost the engine 20-40 CPU-seconds, and a 20 GB image minutes."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from builder.gating.settings import GateCall, GateSettings
from builder.pins import model as pins_mod
from builder.runners.runc_runner import RuncRunner


def provenance_on_rootfs(pins: pins_mod.Pins, rootfs: Path) -> dict[str, Any]:
    """Run the provenance gate on the tree; {status, reason, seconds, runtime, network, failures}."""
    start = time.monotonic()
    runner = RuncRunner(pins, rootfs)
    try:
        settings = GateSettings.of(pins)
        result, facts = runner.run(GateCall("provenance", settings), settings.timeout_s)
    finally:
        runner.close()
    return {"status": result.status, "reason": result.reason, "seconds": round(time.monotonic() - start, 2),
            "runtime": facts.get("version"), "container": facts.get("container"), "network": facts.get("network"),
            "failures": list(result.evidence.failures or [])[:5]}
