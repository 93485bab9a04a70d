"""Real-repos check: lock, build and check an image with real Megatron-LM and verl PR heads.

usage: python benchmarks/real_repos.py --mirrors DIR [--megatron-pr 6772] [--verl-pr 7369]
                                       [--base REF] [--work DIR] [--compare-resolvers]
   or: make real-repos MIRRORS=DIR

DIR holds bare mirrors: megatron.git and verl.git (each with refs/heads/main and
refs/pull/<N>/head) and verl-recipe.git (verl's `recipe` submodule). Trim a GitHub snapshot to
the refs needed with `git init --bare DIR/x.git && git -C DIR/x.git fetch SNAPSHOT
+refs/heads/main:refs/heads/main +refs/pull/N/head:refs/pull/N/head`.

The pins name the public URLs; a git config file (BUILDER_GIT_CONFIG) redirects them to DIR with
url.<base>.insteadOf, as an air-gapped site would. The demo engine (tinyengine) stays in the vLLM
role, the base is the demo base (torch from the base, a constraint: never downloaded). Steps:
`builder lock --build-sdists` (verl needs antlr4-python3-runtime, an sdist), `builder build`,
the provenance gate in a fresh container (`builder accept --gate provenance`), then
`python -c "import megatron.core, verl"` in a fresh network-none container.
Prints the lock size, wheel count, build time and image size. Not a CI test: CI has no mirrors.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PUBLIC = {"megatron": "https://github.com/NVIDIA/Megatron-LM.git",
          "verl": "https://github.com/verl-project/verl.git",
          "recipe": "https://github.com/verl-project/verl-recipe.git"}
MIRROR_NAMES = {"megatron": "megatron.git", "verl": "verl.git", "recipe": "verl-recipe.git"}
# megatron-core says requires-python >=3.12 but imports on 3.11 (the demo base); upstream installs
# it with --no-build-isolation --no-deps (its metadata needs pybind11 from the build requirements).
COMPONENTS = {
    "megatron": {"distribution": "megatron-core", "modules": ["megatron.core"],
                 "pip_args": ["--no-build-isolation", "--no-deps", "--ignore-requires-python"]},
    "verl": {"distribution": "verl", "modules": ["verl"], "pip_args": ["--no-build-isolation", "--no-deps"]},
}


# megatron.core imports triton at import time (transformer/moe/ops/paged_stash.py); NGC's CUDA torch
# brings it, the demo base's CPU torch does not. A compat pin puts it into the lock.
COMPAT_TRITON = {"package": "triton", "version": "3.9.0",
                 "reason": "megatron.core imports triton, CUDA torch brings it, the CPU demo base does not"}


def say(message: str) -> None:
    print(message, flush=True)


def git_head(repo: Path, ref: str) -> str:
    return subprocess.run(["git", "--git-dir", str(repo), "rev-parse", ref], check=True,
                          capture_output=True, text=True).stdout.strip()


def base_ref(explicit: str | None) -> str:
    """The demo base image: --base, else `python -m demo base` (builds it if missing) prints it."""
    if explicit:
        return explicit
    out = subprocess.run([sys.executable, "-m", "demo", "base"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return re.findall(r"\S+@sha256:[0-9a-f]{64}", out)[-1]


def write_pins(work: Path, mirrors: Path, prs: dict[str, int], base: str) -> Path:
    from demo.make_stack import make_stack

    stack = work / "demo-stack"
    make_stack(stack)
    demo = yaml.safe_load((ROOT / "pins" / "demo.yaml").read_text())
    data = {key: demo[key] for key in ("schema_version", "recipe", "acceptance")}
    data["name"] = "real-megatron-verl"
    data["image"] = {"repository": "127.0.0.1:5000/real/unified", "tags": ["real"]}
    data["base"] = {**demo["base"], "image": base}
    vllm = dict(demo["components"]["vllm"], url=str(stack / "tinyengine.git"))
    data["components"] = {"vllm": vllm}
    for name, spec in COMPONENTS.items():
        mirror = mirrors / MIRROR_NAMES[name]
        data["components"][name] = {
            "url": PUBLIC[name], "target": "main", "pr": prs[name],
            "commit": git_head(mirror, f"refs/pull/{prs[name]}/head"),
            "distribution": spec["distribution"], "modules": spec["modules"],
            "install": {"pip_args": spec["pip_args"], "env": {}}}
    data["compat"] = demo.get("compat", []) + [COMPAT_TRITON]
    data["build"] = {"env": demo["build"].get("env", {}), "lock": "locks/real.lock", "constraints": ["torch"]}
    data["acceptance"] = {**data["acceptance"], "required_gates": ["provenance"]}
    (work / "locks").mkdir(exist_ok=True)
    pins = work / "pins.yaml"
    pins.write_text(yaml.safe_dump(data, sort_keys=False))
    return pins


def write_git_config(work: Path, mirrors: Path) -> Path:
    rules = "".join(f'[url "{mirrors / MIRROR_NAMES[name]}"]\n\tinsteadOf = {url}\n' for name, url in PUBLIC.items())
    path = work / "mirrors.gitconfig"
    path.write_text(rules)
    return path


def builder(args: list[str], env: dict, log: Path) -> tuple[int, float, str]:
    """Run `python -m builder.cli ARGS`; stdout returned, stderr to log (tail shown on failure)."""
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.run([sys.executable, "-m", "builder.cli", *args], check=False, cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=err, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        say(f"  `builder {args[0]}` exited {proc.returncode} after {took:.1f} s; last lines of {log}:")
        for line in log.read_text().splitlines()[-15:]:
            say(f"    {line}")
    return proc.returncode, took, proc.stdout


def lock_entries(lock: Path) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", lock.read_text(), re.MULTILINE)]


def docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], check=False, capture_output=True, text=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mirrors", type=Path, required=True)
    ap.add_argument("--megatron-pr", type=int, default=6772)
    ap.add_argument("--verl-pr", type=int, default=7369)
    ap.add_argument("--base")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "real-repos")
    ap.add_argument("--compare-resolvers", action="store_true", help="also time pip's resolver against uv")
    args = ap.parse_args()
    mirrors, work = args.mirrors.resolve(), args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    for name in MIRROR_NAMES.values():
        if not (mirrors / name / "HEAD").exists():
            raise SystemExit(f"--mirrors: expected a bare repository {mirrors / name}")
    base = base_ref(args.base)
    pins = write_pins(work, mirrors, {"megatron": args.megatron_pr, "verl": args.verl_pr}, base)
    env = {**os.environ, "BUILDER_GIT_CONFIG": str(write_git_config(work, mirrors))}
    say(f"pins        {pins} (megatron #{args.megatron_pr}, verl #{args.verl_pr}, base {base})")

    rc, t_lock, _ = builder(["lock", str(pins), "--build-sdists"], env, work / "lock.log")
    lock = work / "locks" / "real.lock"
    if rc != 0 or not lock.exists():
        say("lock        FAILED")
        return 1
    entries = lock_entries(lock)
    say(f"lock        {lock.stat().st_size} bytes, {len(entries)} wheels, {t_lock:.1f} s")
    if args.compare_resolvers:
        compare_resolvers(pins, env, work)

    rc, t_build, out = builder(["build", str(pins), "--quiet"], env, work / "build.log")
    if rc != 0:
        say("build       FAILED")
        return 1
    image = json.loads(out)["image_id"]
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image).stdout.strip() or 0)
    say(f"build       {t_build:.1f} s, image {image[:19]}, {size / 1e9:.2f} GB")

    rc, t_gate, _ = builder(["accept", str(pins), "--image", image, "--gate", "provenance",
                             "--out", str(work / "run")], env, work / "accept.log")
    report = json.loads((work / "run" / "report.json").read_text()) if (work / "run" / "report.json").exists() else {}
    gate = next((g for g in report.get("gates", []) if g["name"] == "provenance"), {})
    say(f"provenance  {gate.get('status', 'not run')} ({t_gate:.1f} s) {gate.get('reason', '')}".rstrip())

    probe = "import megatron.core, verl; print(megatron.core.__version__, verl.__version__)"
    start = time.perf_counter()
    python = yaml.safe_load(pins.read_text())["base"].get("python_bin", "python")
    proc = docker("run", "--rm", "--network", "none", image, python, "-c", probe)
    took = time.perf_counter() - start
    result = proc.stdout.strip() if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]
    say(f"imports     {'ok' if proc.returncode == 0 else 'FAILED'} ({took:.1f} s): {result}")
    say(f"summary     lock {lock.stat().st_size} B / {len(entries)} wheels, build {t_build:.1f} s, "
        f"image {size / 1e9:.2f} GB, provenance {gate.get('status', 'not run')}, "
        f"imports {'ok' if proc.returncode == 0 else 'failed'}")
    return 0 if rc == 0 and proc.returncode == 0 else 1


def compare_resolvers(pins: Path, env: dict, work: Path, runs: int = 2) -> None:
    """pip's resolver against uv on this closure: `builder lock --resolver R` on a copy of the pins
    (same inputs, caches of the first lock warm), each run `runs` times; the resolve steps' own times
    from the log, and whether both give the same pinned closure."""
    closures = {}
    for name in ("uv", "pip"):
        data = yaml.safe_load(pins.read_text())
        data["build"]["lock"] = f"locks/real-{name}.lock"
        copy = work / f"pins-{name}.yaml"
        copy.write_text(yaml.safe_dump(data, sort_keys=False))
        times = []
        for run in range(runs):
            log = work / f"lock-{name}-{run}.log"
            rc, took, _ = builder(["lock", str(copy), "--build-sdists", "--resolver", name], env, log)
            steps = [float(x) for x in re.findall(rf"<== lock: resolve \w+ closure \({name}\) \(([0-9.]+) s\)",
                                                   log.read_text())]
            times.append((sum(steps), took) if rc == 0 else (float("nan"), took))
        lock_text = (work / "locks" / f"real-{name}.lock").read_text()
        closures[name] = sorted(re.findall(r"^(\S+==\S+)", lock_text, re.MULTILINE))
        figures = ", ".join(f"resolve {r:.2f} s (lock {t:.1f} s)" for r, t in times)
        say(f"resolver    {name:<4} {figures}; {len(closures[name])} pinned")
    same = closures["uv"] == closures["pip"]
    diff = sorted(set(closures["uv"]) ^ set(closures["pip"]))[:6]
    say(f"resolver    same closure: {same}{'' if same else f' (differences: {diff})'}")

if __name__ == "__main__":
    sys.exit(main())
