"""The cost of every process on every node (issue 35), measured three ways on the demo image.

    python benchmarks/bench_nodes.py PINS IMAGE_ID [--repeats 3]

1. census: the zero_update gate under Docker with the census on and off (settings.census), interleaved: the gate's
   wall seconds and the census's CPU seconds, every part of it the gate's evidence names (census.cpu_parts: the
   census thread, and where the runner starts one the census container's fanotify reader, its cgroup's CPU;
   an older suite's evidence: cpu_s alone, the thread) (goal: at most 0.3 s a gate, all parts together);
2. layout: the zero_update gate under Slurm with the recipe on one node and across two (the rollout engine on n2),
   interleaved, each from the same .sqsh; the census's CPU summed over every node's census (each rank's);
3. staging: the node check on both nodes reading the shared .sqsh, against node-local staging cold (fill), warm
   (hit) and with 4 jobs at once on an empty node-local directory (one fills per node under the lock, the rest
   wait and hit).
PINS: pins/demo.local.yaml after `make demo`; IMAGE_ID: a built demo image. Starts the demo's two-node cluster if
needed (not for --only census). Prints JSON.
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

from builder.core.evidence import Evidence  # noqa: E402
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
GOAL_S = 0.3  # the census's CPU a gate, every part on every node (issue 47)
PARTS = ("census", "layout", "staging")


def census_parts(evidence: Evidence) -> dict[str, float]:
    """The census's CPU seconds per part, on every node of one gate: each node's census (rank 0's evidence and each
    other rank's) by part (cpu_parts: thread, fanotify; an older suite's cpu_s: the thread), summed over nodes."""
    out: dict[str, float] = {}
    ranks = [r.get("evidence") or {} for r in evidence.ranks or []]
    for census in [evidence.census, *(r.get("census") for r in ranks)]:
        if not isinstance(census, dict):
            continue
        parts = census.get("cpu_parts")
        found = parts if isinstance(parts, dict) and parts else {"thread": census.get("cpu_s") or 0.0}
        for part, seconds in found.items():
            out[part] = round(out.get(part, 0.0) + float(seconds if isinstance(seconds, (int, float)) else 0.0), 3)
    return out


def _cpu(parts: list[dict[str, float]]) -> dict[str, Any]:
    totals = [round(sum(p.values()), 3) for p in parts]
    names = sorted({k for p in parts for k in p})
    return {"census_cpu_s": totals, "census_cpu_median_s": statistics.median(totals) if totals else None,
            "parts_median_s": {k: statistics.median([p.get(k, 0.0) for p in parts]) for k in names},
            "goal_s": GOAL_S, "met": bool(totals) and max(totals) <= GOAL_S}


def census(pins: model.Pins, client: Any, image_id: str, repeats: int) -> dict[str, Any]:
    runner = DockerRunner(client, pins, image_id, uuid.uuid4().hex[:12])
    times: dict[str, list[float]] = {"on": [], "off": []}
    parts: list[dict[str, float]] = []
    try:
        for _ in range(repeats):
            for side in ("on", "off"):
                call = GateCall(GATE, GateSettings.of(pins), census=side == "on")
                start = time.monotonic()
                result, _ = runner.run(call, pins.acceptance.timeout_s)
                times[side].append(round(time.monotonic() - start, 2))
                assert result.status == "pass", (side, result.reason)
                if side == "on":
                    parts.append(census_parts(result.evidence))
    finally:
        runner.close()
    return {"seconds": times, "median": {k: statistics.median(v) for k, v in times.items()}, **_cpu(parts)}


def layout(pins: model.Pins, facts: SqshFacts, settings: Settings, repeats: int) -> dict[str, Any]:
    runners = {}
    for nodes in (1, 2):
        laid = pins.model_copy(update={"acceptance": pins.acceptance.model_copy(update={"nodes": nodes})})
        made = plan.make(laid, plan.Flags(slurm=True, gates=[GATE]), settings).acceptance
        runners[nodes] = (laid, SlurmRunner(laid, made, facts))
    times: dict[int, list[float]] = {1: [], 2: []}
    parts: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    try:
        for _ in range(repeats):
            for nodes, (laid, runner) in runners.items():
                start = time.monotonic()
                result, _ = runner.run(GateCall(GATE, GateSettings.of(laid)), laid.acceptance.timeout_s)
                times[nodes].append(round(time.monotonic() - start, 2))
                assert result.status == "pass", (nodes, result.reason)
                parts[nodes].append(census_parts(result.evidence))
    finally:
        for _, runner in runners.values():
            runner.close()
    return {"seconds": {f"{k} node(s)": v for k, v in times.items()},
            "median": {f"{k} node(s)": statistics.median(v) for k, v in times.items()},
            "census": {f"{k} node(s)": _cpu(v) for k, v in parts.items()},
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
    parser.add_argument("--only", choices=PARTS, action="append", help="run only these parts (default: all)")
    args = parser.parse_args()
    only = args.only or list(PARTS)
    settings = Settings.from_env()
    pins = model.load(args.pins)
    client = engine.connect(settings)
    image_id = engine.image_id(client, args.image_id) or args.image_id
    out: dict[str, Any] = {"gate": GATE, "repeats": args.repeats}
    if "census" in only:
        out["census"] = census(pins, client, image_id, args.repeats)
    if only != ["census"]:
        out.update(on_cluster(pins, client, image_id, settings, args.repeats, only))
    print(json.dumps(out, indent=1))


def on_cluster(pins: model.Pins, client: Any, image_id: str, settings: Settings, repeats: int,
               only: list[str]) -> dict[str, Any]:
    os.environ["SLURM_CONF"] = str(cluster.start().conf)
    where = settings.cache("bench-nodes")
    made = plan.make(pins, plan.Flags(slurm=True, gates=[GATE]), settings).acceptance
    assert isinstance(made.place, plan.SlurmPlace)
    record = sqsh.export_candidate(image_id, sqsh_path(made.place, image_id), settings, client, pins.base.image)
    facts = SqshFacts(path=record.path, sha256=record.sha256, size=record.size, image_id=image_id)
    out: dict[str, Any] = {"sqsh_bytes": record.size}
    if "layout" in only:
        out["layout"] = layout(pins, facts, settings, repeats)
    if "staging" in only:
        out["staging"] = staging(facts, where)
    return out


if __name__ == "__main__":
    main()
