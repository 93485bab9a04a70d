"""The cost of every process on every node (issue 35), measured three ways on the demo image.

    python benchmarks/bench_nodes.py PINS IMAGE_ID [--repeats 3]

1. census: the zero_update gate under Docker with the census on and off (settings.census), interleaved: the gate's
   wall seconds and the census thread's own CPU seconds (goal: at most 0.3 s a gate);
2. layout: the zero_update gate under Slurm with the recipe on one node and across two (the rollout engine on n2),
   interleaved, each from the same .sqsh;
3. staging: the node check on both nodes reading the shared .sqsh, against node-local staging cold (fill), warm
   (hit) and with 4 jobs at once on an empty node-local directory (one fills per node under the lock, the rest
   wait and hit).
PINS: pins/demo.local.yaml after `make demo`; IMAGE_ID: a built demo image. Starts the demo's two-node cluster if
needed. Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.core.options import Settings  # noqa: E402
from builder.core.records import SqshFacts  # noqa: E402
from builder.engine import client as engine  # noqa: E402
from builder.gating import plan  # noqa: E402
from builder.gating.settings import GateCall, GateSettings  # noqa: E402
from builder.pins import model  # noqa: E402
from builder.release import sqsh  # noqa: E402
from builder.runners import nodecheck, slurm
from builder.runners import slurm_runtimes as runtimes  # noqa: E402
from builder.runners.docker_runner import DockerRunner  # noqa: E402
from builder.runners.slurm_candidate import sqsh_path  # noqa: E402
from builder.runners.slurm_runner import SlurmRunner  # noqa: E402
from demo import cluster  # noqa: E402

GATE = "zero_update"


def census(pins: model.Pins, client: Any, image_id: str, repeats: int) -> dict[str, Any]:
    runner = DockerRunner(client, pins, image_id, uuid.uuid4().hex[:12])
    times: dict[str, list[float]] = {"on": [], "off": []}
    cpu: list[float] = []
    try:
        for _ in range(repeats):
            for side in ("on", "off"):
                call = GateCall(GATE, GateSettings.of(pins), census=side == "on")
                start = time.monotonic()
                result, _ = runner.run(call, pins.acceptance.timeout_s)
                times[side].append(round(time.monotonic() - start, 2))
                assert result.status == "pass", (side, result.reason)
                if side == "on":
                    census = result.evidence.census
                    cpu.append((census.get("cpu_s") or 0.0) if isinstance(census, dict) else 0.0)
    finally:
        runner.close()
    return {"seconds": times, "median": {k: statistics.median(v) for k, v in times.items()},
            "census_cpu_s": cpu, "census_cpu_median_s": statistics.median(cpu)}


def layout(pins: model.Pins, facts: SqshFacts, settings: Settings, repeats: int) -> dict[str, Any]:
    runners = {}
    for nodes in (1, 2):
        laid = pins.model_copy(update={"acceptance": pins.acceptance.model_copy(update={"nodes": nodes})})
        made = plan.make(laid, plan.Flags(slurm=True, gates=[GATE]), settings).acceptance
        runners[nodes] = (laid, SlurmRunner(laid, made, facts))
    times: dict[int, list[float]] = {1: [], 2: []}
    try:
        for _ in range(repeats):
            for nodes, (laid, runner) in runners.items():
                start = time.monotonic()
                result, _ = runner.run(GateCall(GATE, GateSettings.of(laid)), laid.acceptance.timeout_s)
                times[nodes].append(round(time.monotonic() - start, 2))
                assert result.status == "pass", (nodes, result.reason)
    finally:
        for _, runner in runners.values():
            runner.close()
    return {"seconds": {f"{k} node(s)": v for k, v in times.items()},
            "median": {f"{k} node(s)": statistics.median(v) for k, v in times.items()},
            "note": "each node count's first gate includes its allocation and node check"}


def check(facts: SqshFacts, work: Path, local: str) -> tuple[float, list[str]]:
    """One node check on both nodes (its own allocation): seconds, and each node's staging."""
    work.mkdir(parents=True, exist_ok=True)
    script = nodecheck.script(runtimes.get("charliecloud"))
    start = time.monotonic()
    subprocess.run(slurm.with_user(["srun", "-N2", "--ntasks-per-node=1", f"--output={work}/check-%t.out",
                                    "/bin/sh", "-c", script, "check", facts.path, facts.sha256, str(work), local]),
                   check=True, stdin=subprocess.DEVNULL)
    seconds = round(time.monotonic() - start, 2)
    return seconds, [nodecheck.parse(p.read_text(), {}).facts.get("staged", "?") for p in sorted(work.glob("check-*"))]


def staging(facts: SqshFacts, where: Path) -> dict[str, Any]:
    local = str(where / "nodes" / "%n")
    shutil.rmtree(where / "nodes", ignore_errors=True)
    out: dict[str, Any] = {"shared": check(facts, where / "shared", ""), "cold": check(facts, where / "cold", local),
                           "warm": check(facts, where / "warm", local)}
    shutil.rmtree(where / "nodes", ignore_errors=True)
    results: list[tuple[float, list[str]]] = []
    threads = [threading.Thread(target=lambda i=i: results.append(check(facts, where / f"four-{i}", local)))
               for i in range(4)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["four_at_once"] = {"wall_s": round(time.monotonic() - start, 2), "jobs": results}
    out["part_files_left"] = [str(p) for p in (where / "nodes").rglob("*.part.*")]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pins", type=Path)
    parser.add_argument("image_id")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    settings = Settings.from_env()
    os.environ["SLURM_CONF"] = str(cluster.start().conf)
    pins = model.load(args.pins)
    client = engine.connect(settings)
    image_id = engine.image_id(client, args.image_id) or args.image_id
    where = settings.cache("bench-nodes")
    made = plan.make(pins, plan.Flags(slurm=True, gates=[GATE]), settings).acceptance
    assert isinstance(made.place, plan.SlurmPlace)
    record = sqsh.export_candidate(image_id, sqsh_path(made.place, image_id), settings, client, pins.base.image)
    facts = SqshFacts(path=record.path, sha256=record.sha256, size=record.size, image_id=image_id)
    out = {"gate": GATE, "repeats": args.repeats, "sqsh_bytes": record.size,
           "census": census(pins, client, image_id, args.repeats),
           "layout": layout(pins, facts, settings, args.repeats), "staging": staging(facts, where)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
