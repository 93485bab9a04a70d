"""Where a new user first meets the tool (issue 49's table): `make demo`'s phases, `make demo-cluster`'s phases, each
gate's seconds in both and the performance gate's pairs, from one command.

    python benchmarks/bench_first_run.py [--no-cluster] [--json]

Runs `make demo`, then `make demo-cluster` (the Makefile's targets, as a user types them), reads what each prints:
the phase table at the end, every `<== step (N s)` line (set-up, the base's steps, the export's steps, each gate)
and the performance gate's `performance: STATUS after N pair(s) (why)` line. Prints a Markdown table (or JSON).
It measures this machine as it is: on one where the engine, base and caches exist, the set-up and base rows are the
warm ones; `bash benchmarks/fresh_demo.sh` runs `make demo` fresh beside them (its own clone, engine, registry and
cache; benchmarks/README.md says which figures were measured how).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"<== (.+?) \((\d+(?:\.\d+)?) s\)")
PHASE = re.compile(r"^\s{2}(\S.*?)\s+(\d+(?:\.\d+)?) s$")
PAIRS = re.compile(r"performance: (\w+) after (\d+) pair\(s\) \((.*)\)")
STEPS = ("apt-get install", "setup: ", "start ", "base: ", "export .sqsh", "sqsh: ", "copy the accepted", "slurm: ",
         "gate ")


def run(target: str) -> dict[str, Any]:
    """`make TARGET`: its exit code, wall seconds, phase table, the timed steps and the performance gate's pairs."""
    start = time.monotonic()
    proc = subprocess.run(["make", "--no-print-directory", target], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    text = proc.stdout + proc.stderr
    phases: dict[str, float] = {}
    table = text.split("== make demo phase timings ==")[-1] if "phase timings" in text else ""
    for line in table.splitlines()[1:]:
        found = PHASE.match(line)
        if found:
            phases[found.group(1)] = float(found.group(2))
    steps = [(m.group(1), float(m.group(2))) for m in STEP.finditer(text) if m.group(1).startswith(STEPS)]
    pairs = [{"status": m.group(1), "pairs": int(m.group(2)), "stopped": m.group(3)} for m in PAIRS.finditer(text)]
    error = next((line for line in text.splitlines() if line.startswith("error:")), None)
    return {"target": target, "exit": proc.returncode, "seconds": round(time.monotonic() - start, 1),
            "phases": phases, "steps": steps, "performance": pairs, "accepted": "ACCEPTED" in text, "error": error}


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| run | phase | seconds |", "|---|---|---|"]
    for r in results:
        lines.append(f"| **make {r['target']}** | **total** (exit {r['exit']}, "
                     f"{'ACCEPTED' if r['accepted'] else 'not accepted'}) | **{r['seconds']}** |")
        lines += [f"| | {r['error']} | |"] if r["error"] else []
        lines += [f"| | {name} | {seconds:.1f} |" for name, seconds in r["phases"].items()]
        lines += [f"| | - {name} | {seconds:.1f} |" for name, seconds in r["steps"]]
        lines += [f"| | performance gate: {p['status']} after {p['pairs']} pair(s), {p['stopped']} | |"
                  for p in r["performance"]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-cluster", action="store_true", help="only `make demo`")
    parser.add_argument("--json", action="store_true", help="JSON instead of the Markdown table")
    args = parser.parse_args()
    results = [run("demo")]
    if not args.no_cluster and results[0]["exit"] == 0:
        results.append(run("demo-cluster"))
    print(json.dumps(results, indent=1) if args.json else markdown(results))
    return max(int(r["exit"]) for r in results)


if __name__ == "__main__":
    sys.exit(main())
