"""The final smoke of a converted image: the provenance gate on a root filesystem unpacked from the
.sqsh. The tree is imported as a one-layer image (`docker import`, streamed by `tar`) with the
environment the .sqsh's /etc/environment gives (what enroot exports at start), the gate runs in a
fresh network-none container like every gate (builder/accept/gates.py), and the image is removed after."""
from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from builder.accept.docker_runner import DockerRunner
from builder.accept.gates import gate_settings
from builder.core.errors import InfraError
from builder.core.records import Report
from builder.engine import client as engine
from builder.pins import model as pins_mod
from builder.release.sqsh_rootfs import CHUNK

REPOSITORY = "builder-sqsh-smoke"


def environment(rootfs: Path) -> list[str]:
    """KEY=VALUE lines of /etc/environment as Dockerfile ENV instructions."""
    path = rootfs / "etc/environment"
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        key, sep, value = line.partition("=")
        if sep and key:
            out.append(f"ENV {key}={json.dumps(value)}")
    return out


def import_rootfs(client: Any, rootfs: Path, tag: str) -> str:
    """`tar -C rootfs -c . | docker import` with the environment of /etc/environment; the image ID."""
    tar = subprocess.Popen(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", "-", "."],
                           stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    stdout = tar.stdout
    assert stdout is not None
    try:
        image_id = engine.import_stream(client, iter(lambda: stdout.read(CHUNK), b""), REPOSITORY, tag,
                                        environment(rootfs))
    finally:
        stdout.close()
        rc = tar.wait()
    if rc != 0:
        raise InfraError(f"tar -C {rootfs}: exit {rc}")
    return image_id


def provenance_on_rootfs(client: Any, report: Report, pins: pins_mod.Pins, rootfs: Path) -> dict[str, Any]:
    """Run the provenance gate on the tree; {status, reason, seconds, image_id, evidence keys}."""
    tag = uuid.uuid4().hex[:12]
    start = time.monotonic()
    image_id = import_rootfs(client, rootfs, tag)
    try:
        runner = DockerRunner(client, pins, image_id, f"sqsh-{tag}")
        result, facts = runner.run("provenance", gate_settings(pins, "provenance"), pins.acceptance.timeout_s)
    finally:
        engine.remove_image(client, image_id, force=True)
    return {"status": result.status, "reason": result.reason, "seconds": round(time.monotonic() - start, 2),
            "imported_image": image_id, "network": facts.get("network"),
            "failures": (result.evidence.get("failures") or [])[:5]}
