"""Per-gate overhead of Slurm + ch-run over the same gate in Docker, and the one-time node-side sha256 check.

    python benchmarks/bench_cluster.py PINS IMAGE_ID [--gate provenance] [--repeats 5] [--flow]

PINS: the demo's local pins (pins/demo.local.yaml after `make demo`); IMAGE_ID: a built candidate. The .sqsh is
exported (or reused) into <cache>/cluster-images; the one-node cluster of demo/cluster.py is started if needed.
Runs the gate `repeats` times in each place, alternating Docker and Slurm, and prints JSON: each side's median
seconds per gate, the overhead (goal: at most 2 s median, the sha256 check apart), and the check's seconds and
MB/s, and the builder's Slurm client calls (slurm.CALLS) for the allocation, per gate (goal: at most 10) and the
close. `--flow` also times `python -m demo run` against `python -m demo run --slurm` (minutes).

Measured 2026-12-01 on the shared 2-core host (benchmarks/README.md): before, provenance median 4.49 s in Docker and
8.19 s under Slurm + ch-run, overhead 3.7 s (every .pyc of the .sqsh was stale: its files all had one time). After the
export kept each file's layer time: 2.99 s in Docker, 3.89 s under Slurm, overhead 0.9 s median (0.08 to 1.1; goal
2 s: met); sha256 check 5.0 s for 1054 MB (210.6 MB/s).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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
from builder.runners import slurm as client_calls  # noqa: E402
from builder.runners import slurm_candidate as cluster_accept  # noqa: E402
from builder.runners.docker_runner import DockerRunner  # noqa: E402
from builder.runners.slurm_runner import SlurmRunner  # noqa: E402
from demo import cluster  # noqa: E402


def _since(before: dict[str, int]) -> dict[str, int]:
    """The Slurm client commands the builder ran since `before` (slurm.CALLS), by name."""
    return {k: v - before.get(k, 0) for k, v in client_calls.CALLS.items() if v - before.get(k, 0)}


def timed_flow(argv: list[str]) -> dict[str, float]:
    """Seconds and exit code of one demo flow (a time without exit 0 is no figure)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "demo", *argv], check=False, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    return {"seconds": round(time.monotonic() - start, 1), "exit": proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pins", type=Path)
    parser.add_argument("image_id")
    parser.add_argument("--gate", default="provenance")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--flow", action="store_true")
    args = parser.parse_args()
    settings = Settings.from_env()
    os.environ["SLURM_CONF"] = str(cluster.start().conf)
    pins = model.load(args.pins)
    client = engine.connect(settings)
    image_id = engine.image_id(client, args.image_id) or args.image_id
    made = plan.make(pins, plan.Flags(slurm=True, gates=[args.gate]), settings).acceptance
    assert isinstance(made.place, plan.SlurmPlace)
    start = time.monotonic()
    record = sqsh.export_candidate(image_id, cluster_accept.sqsh_path(made.place, image_id), settings, client,
                                    pins.base.image)
    export_s = round(time.monotonic() - start, 1)
    slurm = SlurmRunner(pins, made, SqshFacts(path=record.path, sha256=record.sha256, size=record.size))
    docker = DockerRunner(client, pins, image_id, uuid.uuid4().hex[:12])
    call = GateCall(args.gate, GateSettings.of(pins))
    times: dict[str, list[float]] = {"docker": [], "slurm": []}
    calls: dict[str, Any] = {"per_gate": []}
    try:
        start, before = time.monotonic(), dict(client_calls.CALLS)
        slurm._allocate()  # the allocation and the one-time sha256 check, timed apart
        check_s = round(time.monotonic() - start, 2)
        calls["allocation_and_check"] = _since(before)
        for _ in range(args.repeats):
            for name, runner in (("docker", docker), ("slurm", slurm)):
                start, before = time.monotonic(), dict(client_calls.CALLS)
                result, _ = runner.run(call, pins.acceptance.timeout_s)
                times[name].append(round(time.monotonic() - start, 2))
                if name == "slurm":
                    calls["per_gate"].append(_since(before))
                assert result.status == "pass", (name, result.reason)
    finally:
        before = dict(client_calls.CALLS)
        slurm.close()
        calls["close"] = _since(before)
        docker.close()
    calls["most_per_gate"] = max(sum(c.values()) for c in calls["per_gate"])
    medians = {k: statistics.median(v) for k, v in times.items()}
    out = {"gate": args.gate, "repeats": args.repeats, "seconds": times, "median": medians,
           "overhead_median_s": round(medians["slurm"] - medians["docker"], 2),
           "overheads_s": [round(s - d, 2) for s, d in zip(times["slurm"], times["docker"])],
           "allocation_and_sha256_check_s": check_s, "sha256_check": [n.record()["check"] for n in slurm.nodes],
           "export_s": export_s, "sqsh_bytes": record.size, "client_calls": calls}
    if args.flow:
        out["flow_s"] = {"make demo (python -m demo run)": timed_flow(["run"]),
                         "make demo-cluster (python -m demo run --slurm)": timed_flow(["run", "--slurm"])}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
