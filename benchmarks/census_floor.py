"""The census's floor (issue 47): the shortest interpreter run the polling census sees every time.

    python benchmarks/census_floor.py [--runs 100] [--busy 2] [--sleeps 0,0.005,0.01,0.02,0.03]

For each sleep, `runs` interpreters `python -S -I -c "import time; time.sleep(S)"` start one after another under one
census (acceptance/census.py, the gate's own code and interval), with `busy` busy loops beside it (both cores busy
on a 2-core host). Prints JSON: per sleep, how many runs the census saw as an interpreter, and their median wall time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from acceptance import census  # noqa: E402


def measure(sleep_s: float, runs: int) -> dict[str, float | int]:
    with tempfile.TemporaryDirectory() as tmp:
        seen = census.Census(tmp, census.Components({}), "/nonexistent").start()
        walls = []
        for _ in range(runs):
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-S", "-I", "-c", f"import time; time.sleep({sleep_s})"], check=True)
            walls.append(time.monotonic() - t0)
        raw = seen.stop() or {}
    python = [r for r in raw.get("rows") or [] if r.get("python")]
    return {"sleep_s": sleep_s, "runs": runs, "seen": len(python), "median_wall_s": round(statistics.median(walls), 4),
            "min_wall_s": round(min(walls), 4), "census_cpu_s": raw.get("cpu_s", 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--sleeps", default="0,0.005,0.01,0.02,0.03")
    args = parser.parse_args()
    loops = [subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        rows = [measure(float(s), args.runs) for s in args.sleeps.split(",")]
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print(json.dumps({"interval_s": census.INTERVAL_S, "busy_loops": args.busy, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
