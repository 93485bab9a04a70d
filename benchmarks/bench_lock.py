"""Lock times on the real Megatron-LM + verl pins (prints a table; not a test).

usage: python benchmarks/bench_lock.py --mirrors DIR [--cache DIR]
DIR as for benchmarks/real_repos.py (megatron.git, verl.git, verl-recipe.git). The cold lock runs with an
empty cache of its own (--cache, default a temporary directory; mirrors cloned, every wheel downloaded),
then a re-lock with nothing changed, then a re-lock with --upgrade (resolves again). Each row is
`builder lock --build-sdists` as a whole process; its own table (where the time went, downloads apart)
is printed below. Targets: cold without downloads <= 60 s; re-lock <= 10 s.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_repos  # noqa: E402


def run(pins: Path, env: dict[str, Any], log: Path, *extra: str) -> tuple[float, str]:
    start = time.monotonic()
    with open(log, "w") as err:
        rc = subprocess.call([sys.executable, "-m", "builder.cli", "lock", str(pins), "--build-sdists", *extra],
                             cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    took = time.monotonic() - start
    text = log.read_text()
    if rc != 0:
        raise SystemExit(f"builder lock exited {rc}; last lines of {log}:\n" + "\n".join(text.splitlines()[-15:]))
    return took, text[text.rindex("lock: where the time went"):]


def figure(table: str, row: str) -> float:
    match = re.search(rf"^  {re.escape(row)}\s+([0-9.]+) s", table, re.M)
    return float(match.group(1)) if match else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mirrors", type=Path, required=True)
    ap.add_argument("--cache", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-lock-") as tmp:
        work = Path(tmp)
        cache = (args.cache or work / "cache").resolve()
        base = real_repos.base_ref(None, real_vllm=False)  # the demo base (mypy found the missing argument)
        pins = real_repos.write_pins(work, args.mirrors.resolve(), {"megatron": 6772, "verl": 7369}, base, real_vllm=False)
        env = {**os.environ, "BUILDER_CACHE": str(cache),
               "BUILDER_GIT_CONFIG": str(real_repos.write_git_config(work, args.mirrors.resolve()))}
        rows: list[tuple[str, float, str]] = []
        for name, extra in (("cold (empty cache)", ()), ("re-lock, nothing changed", ()), ("re-lock --upgrade", ("--upgrade",))):
            took, table = run(pins, env, work / f"{len(rows)}.log", *extra)
            rows.append((name, took, table))
        lock_text = (work / "locks" / "real.lock").read_text()
    wheels = len(re.findall(r"--hash=sha256:", lock_text))
    print(f"\nbuilder lock of the real Megatron-LM #6772 + verl #7369 pins ({wheels} wheels), load {os.getloadavg()[0]:.1f}")
    print(f"{'run':<26} {'process s':>10} {'lock s':>8} {'w/o downloads':>14} {'downloads':>10} {'MB':>7}")
    for name, took, table in rows:
        dl = re.search(r"^  downloads\s+([0-9.]+) s\s+(\d+) wheels, ([0-9.]+) MB", table, re.M)
        print(f"{name:<26} {took:>10.1f} {figure(table, 'total'):>8.1f} {figure(table, 'total without downloads'):>14.1f}"
              f" {float(dl.group(1)) if dl else 0:>10.1f} {float(dl.group(3)) if dl else 0:>7.1f}")
    for name, _, table in rows:
        print(f"\n{name}:\n{table.rstrip()}")
    cold, relock = figure(rows[0][2], "total without downloads"), rows[1][1]
    print(f"\ncold without downloads {cold:.1f} s (target 60): {'met' if cold <= 60 else 'MISSED'};"
          f" re-lock {relock:.1f} s (target 10): {'met' if relock <= 10 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
