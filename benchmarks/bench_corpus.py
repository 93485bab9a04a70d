"""Time and peak memory of every hostile-input case (tests/hostile_corpus.py): target 1 s and 100 MB each.

    python benchmarks/bench_corpus.py [--subprocess N]

In-process: each case through the real CLI (builder.core.usage.run_app), wall time and the peak of Python
allocations (tracemalloc). Then the named headline cases (alias bomb, 10,000 nested lists, a 20 MB
value) and the N slowest cases again as `python -m builder.cli` subprocesses: wall time and the
child's peak RSS (os.wait4), interpreter start-up included. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hostile_corpus import Case, all_cases, run_in_process  # noqa: E402

HEADLINE = ("parser-alias-bomb-9x9", "parser-alias-bomb-20x2", "parser-nested-lists-10000",
            "parser-nested-maps-10000", "parser-file-20000000-bytes-value")


def in_process(case: Case) -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "case"
        folder.mkdir()
        os.environ["BUILDER_CACHE"] = str(Path(tmp) / "cache")
        argv = case.setup(folder)
        tracemalloc.start()
        start = time.perf_counter()
        out = run_in_process(argv, [])
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return took, peak, out.code


# the child writes its own peak RSS (VmHWM: this process image only, not the parent it was forked from)
CHILD = """
import atexit, os, sys
def peak():
    with open("/proc/self/status") as status, open(os.environ["BENCH_HWM"], "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM")).split()[1])
atexit.register(peak)
sys.argv[0] = "builder"
from builder.cli import main
main()
"""


def as_subprocess(case: Case) -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "case"
        folder.mkdir()
        argv = case.setup(folder)
        hwm = Path(tmp) / "hwm"
        env = {**os.environ, "BUILDER_CACHE": str(Path(tmp) / "cache"), "BENCH_HWM": str(hwm)}
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        took = time.perf_counter() - start
        peak = int(hwm.read_text()) * 1024 if hwm.exists() else -1
    return took, peak, run.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subprocess", type=int, default=5, help="also run the N slowest cases as subprocesses")
    args = parser.parse_args()
    cases = all_cases()
    for klass in dict.fromkeys(c.klass for c in cases):  # warm-up: first imports are not the input's cost
        in_process(next(c for c in cases if c.klass == klass))
    in_process(next(c for c in cases if c.accept))
    by_class: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    results = []
    for case in cases:
        took, peak, code = in_process(case)
        by_class[case.klass].append((took, peak, case.id))
        results.append((took, peak, code, case))
    print(f"{len(cases)} cases, in-process (real CLI, tracemalloc peak)")
    print(f"{'class':<10} {'cases':>5} {'slowest s':>10} {'peak MiB':>9}  slowest case")
    for klass, rows in by_class.items():
        slow = max(rows)
        print(f"{klass:<10} {len(rows):>5} {slow[0]:>10.3f} {max(r[1] for r in rows) / 2**20:>9.1f}  {slow[2]}")
    slowest = max(results, key=lambda r: r[0])
    biggest = max(results, key=lambda r: r[1])
    print(f"slowest: {slowest[3].id} {slowest[0]:.3f} s; peak memory: {biggest[3].id} {biggest[1] / 2**20:.1f} MiB")
    for took, peak, code, case in results:
        if case.id in HEADLINE:
            print(f"  {case.id:<44} {took:.3f} s  {peak / 2**20:.1f} MiB  exit {code}")
    picked = [c for c in cases if c.id in HEADLINE]
    picked += [r[3] for r in sorted(results, key=lambda r: -r[0])[:args.subprocess] if r[3] not in picked]
    print("\nas subprocesses (python -m builder.cli; start-up and imports included; peak RSS of the child)")
    baseline = as_subprocess(Case("usage", "help", lambda f: ["--help"], None))
    print(f"  {'baseline: builder --help':<44} {baseline[0]:.3f} s  {baseline[1] / 2**20:.0f} MiB")
    for case in picked:
        took, rss, code = as_subprocess(case)
        print(f"  {case.id:<44} {took:.3f} s  {rss / 2**20:.0f} MiB  exit {code}")


if __name__ == "__main__":
    main()
