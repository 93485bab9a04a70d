"""`builder bisect` on a 16-commit range of the demo stack against a plain `git bisect run`.

    python benchmarks/bench_bisect.py [--work DIR] [--defect-at 11]

A copy of the demo stack gets tinyrl PR 90: 16 commits on PR 33's head, a notes line each, commit `--defect-at`
taking old_log_prob from the plain forward (zero_update differs). GOOD is the demo pins, BAD the same with verl
at PR 90's head. It prints JSON: bisect's builds against the bound ceil(log2 N) + skipped + checks (GOOD and
BAD; one moved component), the seconds per step (build, gates), the total, and the same range under
`git bisect run` with a script that rewrites the pin, re-locks and runs `builder build` (any failure there: 125,
skip), then `builder run` (NOT ACCEPTED: 1; any other failure: 125). Both run only the zero_update gate (bisect
with --gate, the git bisect run script's pins with zero_update the only required gate).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pygit2
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from builder.core.options import Settings  # noqa: E402
from demo.prepare import add_pr_commit, prepare_demo, variant_pins  # noqa: E402

PR = 90
STEP_SCRIPT = """#!/bin/sh
# one `git bisect run` step: the pin to HEAD, re-lock, build (125: skip), run (1: bad)
set -u
sha=$(git rev-parse HEAD)
{python} - "$sha" <<'PY' || exit 125
import sys, yaml
path = "{pins}"
data = yaml.safe_load(open(path))
data["components"]["verl"]["commit"] = sys.argv[1]
open(path, "w").write(yaml.safe_dump(data, sort_keys=False))
PY
t0=$(date +%s.%N)
{builder} lock {pins} --allow-moved-pr >/dev/null 2>&1 || exit 125
{builder} build {pins} --allow-moved-pr --quiet >/dev/null 2>&1 || exit 125
t1=$(date +%s.%N)
rm -rf {out}
{builder} run {pins} --allow-moved-pr --out {out} >/dev/null 2>&1
code=$?
echo "$sha $t0 $t1 $(date +%s.%N) $code" >> {times}
# 0 ACCEPTED (good), 1 NOT ACCEPTED (bad); anything else (bad input, infrastructure) is no verdict: skip
[ $code -le 1 ] && exit $code
exit 125
"""


def series(stack: Path, defect_at: int) -> list[str]:
    repo = pygit2.Repository(str(stack / "tinyrl.git"))
    head = repo.references["refs/pull/33/head"].resolve().target
    repo.references.create(f"refs/pull/{PR}/head", head, force=True)
    main_ppo = repo[head].tree["tinyrl"] / "main_ppo.py"
    text = repo[main_ppo.id].data.decode()
    shas, notes = [], "# Notes\n"
    for i in range(1, 17):
        if i == defect_at:
            shas.append(add_pr_commit(stack / "tinyrl.git", PR, "tinyrl/main_ppo.py",
                                      text.replace("aligned=batch_invariant)", "aligned=False)"),
                                      "main_ppo: old_log_prob from the plain forward\n"))
            continue
        notes += f"- note {i}\n"
        shas.append(add_pr_commit(stack / "tinyrl.git", PR, "NOTES.md", notes, f"docs: note {i}\n"))
    return shas


def builder(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / ".venv/bin/builder"), *args], capture_output=True, text=True, env=env)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--defect-at", type=int, default=11)
    ap.add_argument("--git-only", action="store_true", help="only the git bisect run side")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-bisect-"))
    demo = prepare_demo(Settings.from_env())
    good = variant_pins(work / "good", pins_path=demo)
    bad_dir = work / "bad"
    bad = variant_pins(bad_dir, pins_path=demo)
    shas = series(bad_dir / "demo-stack", args.defect_at)
    data = yaml.safe_load(bad.read_text())
    data["components"]["verl"].update(pr=PR, commit=shas[-1])
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    env = dict(os.environ)

    started = time.monotonic()
    argv = ["bisect", str(good), str(bad), "--gate", "zero_update", "--out", str(work / "out")]
    done = builder(*(["--help"] if args.git_only else argv), env=env)
    bisect_s = time.monotonic() - started
    answer = json.loads((work / "out" / "bisect.json").read_text()) if (work / "out" / "bisect.json").is_file() else {}
    steps = answer.get("steps", [])

    # the same range under git bisect run, on a work tree of the same repository
    tree = work / "tinyrl-work"
    subprocess.run(["git", "clone", "-q", str(bad_dir / "demo-stack" / "tinyrl.git"), str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "fetch", "-q", "origin", f"refs/pull/{PR}/head"], check=True)
    pins = work / "git-bisect" / "pins.yaml"
    def only_zero_update(data: dict[str, object]) -> None:
        acceptance = data["acceptance"]
        assert isinstance(acceptance, dict)
        acceptance["required_gates"] = ["zero_update"]  # `builder run`'s verdict is then the gate's
        acceptance.pop("performance", None)

    variant_pins(pins.parent, pins_path=bad, edit=only_zero_update)
    script = work / "step.sh"
    script.write_text(STEP_SCRIPT.format(python=ROOT / ".venv/bin/python", pins=pins, builder=ROOT / ".venv/bin/builder",
                                         out=work / "git-bisect" / "run", times=work / "git-bisect" / "times"))
    script.chmod(0o755)
    good_sha = yaml.safe_load(good.read_text())["components"]["verl"]["commit"]
    git = ["git", "-C", str(tree)]
    started = time.monotonic()
    subprocess.run([*git, "bisect", "start", shas[-1], good_sha], check=True, capture_output=True)
    run = subprocess.run([*git, "bisect", "run", str(script)], capture_output=True, text=True)
    git_s = time.monotonic() - started
    git_steps = run.stdout.count("running ")
    named = next((line.split()[0] for line in run.stdout.splitlines() if "is the first bad commit" in line), None)
    git_log = subprocess.run([*git, "bisect", "log"], capture_output=True, text=True).stdout
    subprocess.run([*git, "bisect", "reset"], capture_output=True)

    n = len(shas)
    times = (work / "git-bisect" / "times").read_text().split("\n") if (work / "git-bisect" / "times").is_file() else []
    git_steps_s = [{"commit": f[0][:12], "lock_build_s": round(float(f[2]) - float(f[1]), 1),
                    "run_s": round(float(f[3]) - float(f[2]), 1), "exit": int(f[4])}
                   for f in (line.split() for line in times) if len(f) == 5]
    print(json.dumps({
        "range": n, "defect": shas[args.defect_at - 1],
        "bisect": {"exit": done.returncode, "said": (done.stdout.strip() or done.stderr.strip()[-300:]),
                   "first_bad": (answer.get("first_bad") or {}).get("commit"),
                   "builds": answer.get("builds"), "bound": math.ceil(math.log2(n)) + len(answer.get("skipped", [])) + 2,
                   "total_s": round(bisect_s, 1),
                   "steps": [{"why": s["why"], "verdict": s["verdict"], "build_s": round(s["build_s"], 1),
                              "gate_s": round(s["gate_s"], 1)} for s in steps]},
        "git_bisect_run": {"exit": run.returncode, "first_bad": named, "steps": git_steps, "total_s": round(git_s, 1),
                           "per_step": git_steps_s,
                           "log": [line for line in git_log.splitlines() if not line.startswith("#")]},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
