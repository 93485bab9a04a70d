"""Real-repos check: lock, build and check an image with real vLLM, Megatron-LM and verl.

usage: python benchmarks/real_repos.py --mirrors DIR [--vllm real|demo] [--megatron-pr 6772]
                                       [--verl-pr 7369] [--base REF] [--work DIR] [--compare-resolvers]
   or: make real-repos MIRRORS=DIR

DIR holds bare mirrors: megatron.git and verl.git (each with refs/heads/main and
refs/pull/<N>/head), verl-recipe.git (verl's `recipe` submodule), onednn.git (uxlfoundation/oneDNN
with the tag vLLM's CMake names) and vllm-<version>.git; a missing one is made from that vLLM sdist
on pip's index (benchmarks/real_vllm.py: tag v<version>, one Python-only commit on top as PR #1). Trim a
GitHub snapshot to the refs needed with `git init --bare DIR/x.git && git -C DIR/x.git fetch SNAPSHOT
+refs/heads/main:refs/heads/main +refs/pull/N/head:refs/pull/N/head`. Optional mirrors of vLLM's
CUDA native inputs (CUDA_INPUTS below) let the CUDA listing resolve their tags.

The pins name the public URLs; a git config file (BUILDER_GIT_CONFIG) redirects them to DIR with
url.<base>.insteadOf, as an air-gapped site would. vLLM is built for the cpu target against the
base's torch, its oneDNN supplied offline as a native input; the base is the demo base's recipe with
a C++ toolchain (benchmarks/real_vllm_base.py: the demo base has no g++ and vLLM needs g++ >= 12.3).
`--vllm demo` keeps the demo engine (tinyengine) in the vLLM role on the demo base. Steps:
`builder lock --build-sdists` (verl needs antlr4-python3-runtime, an sdist), `builder build`,
the provenance gate in a fresh container (`builder accept --gate provenance`, loads vllm._C), then
`python -c "import vllm, megatron.core, verl"` in a fresh network-none container, then the native
inputs the lock finds for vLLM's cuda target (not built). Prints every step's time, the lock size,
wheel count, build time and image size. Not a CI test: CI has no mirrors.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_vllm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PUBLIC = {"megatron": "https://github.com/NVIDIA/Megatron-LM.git",
          "verl": "https://github.com/verl-project/verl.git",
          "recipe": "https://github.com/verl-project/verl-recipe.git",
          "vllm": "https://github.com/vllm-project/vllm.git",
          # vLLM's cmake names oneapi-src/oneDNN (renamed uxlfoundation/oneDNN; GitHub redirects)
          "onednn": "https://github.com/oneapi-src/oneDNN.git"}
MIRROR_NAMES = {"megatron": "megatron.git", "verl": "verl.git", "recipe": "verl-recipe.git",
                "vllm": "vllm-<version>.git", "onednn": "onednn.git"}  # vllm: set in main()
REAL_ONLY = ("vllm", "onednn")
# vLLM's CUDA native inputs (cmake/external_projects/*.cmake, CMakeLists.txt): public URL as its CMake
# writes it -> mirror name in DIR; used when present, to resolve tags and check commits.
CUDA_INPUTS = {"https://github.com/nvidia/cutlass.git": "cutlass.git",
               "https://github.com/NVIDIA/cutlass": "cutlass.git",
               "https://github.com/triton-lang/triton.git": "triton.git",
               "https://github.com/vllm-project/DeepGEMM.git": "DeepGEMM.git",
               "https://github.com/vllm-project/DeepSelect.git": "DeepSelect.git",
               "https://github.com/vllm-project/MSA.git": "MSA.git",
               "https://github.com/vllm-project/FlashMLA": "FlashMLA.git",
               "https://github.com/vllm-project/FlashKDA.git": "FlashKDA.git",
               "https://github.com/IST-DASLab/qutlass.git": "qutlass.git",
               "https://github.com/vllm-project/tml-fa4.git": "tml-fa4.git",
               "https://github.com/vllm-project/flash-attention.git": "flash-attention.git"}
# megatron-core says requires-python >=3.12 but imports on 3.11 (the demo base); upstream installs
# it with --no-build-isolation --no-deps (its metadata needs pybind11 from the build requirements).
COMPONENTS = {
    "megatron": {"distribution": "megatron-core", "modules": ["megatron.core"],
                 "pip_args": ["--no-build-isolation", "--no-deps", "--ignore-requires-python"]},
    "verl": {"distribution": "verl", "modules": ["verl"], "pip_args": ["--no-build-isolation", "--no-deps"]},
}
# vLLM from source for the cpu target, against the base's torch (vLLM's Dockerfile.cpu builds the
# same way: --no-build-isolation after use_existing_torch). MAX_JOBS: the machine's cores.
VLLM = {"distribution": "vllm", "modules": ["vllm"],
        # --verbose: the compile steps ([N/M] from ninja) reach the build log, so a long build shows how far it got
        "pip_args": ["--no-build-isolation", "--no-deps", "--verbose"],
        # ASIMD_FOUND: vLLM's cpu_extension.cmake reads it from the build machine's /proc/cpuinfo
        # (an aarch64 oneDNN commit when set); an x86_64 build host never has it
        "native": {"device": "cpu", "device_var": "VLLM_TARGET_DEVICE", "max_jobs": os.cpu_count() or 2,
                   "modules": ["vllm._C"], "cmake_vars": {"ASIMD_FOUND": "OFF"}},
        "base_torch": True}


# megatron.core imports triton at import time (transformer/moe/ops/paged_stash.py); NGC's CUDA torch
# brings it, the demo base's CPU torch does not. A compat pin puts it into the lock.
COMPAT_TRITON = {"package": "triton", "version": "3.9.0",
                 "reason": "megatron.core imports triton, CUDA torch brings it, the CPU demo base does not"}
# vLLM's requirements/cpu.txt: `triton @ https://github.com/triton-lang/triton-cpu/releases/...whl`
# (triton-cpu, GitHub only). The CPU build does not use it; the locked triton (above) takes its place.
VLLM_DIRECT_URLS = [{"package": "triton", "version": "3.9.0",
                     "reason": "triton-cpu is a GitHub release asset, not on the package index. The CPU build does not need it "
                               "and megatron.core needs the locked triton 3.9.0 anyway"}]


def say(message: str) -> None:
    print(message, flush=True)


def git_head(repo: Path, ref: str) -> str:
    return subprocess.run(["git", "--git-dir", str(repo), "rev-parse", ref], check=True,
                          capture_output=True, text=True).stdout.strip()


def base_ref(explicit: str | None, real_vllm: bool) -> str:
    """--base, else the real-vLLM base (benchmarks/real_vllm_base.py) or the demo base
    (`python -m demo base`); each is built once and cached."""
    if explicit:
        return explicit
    script = ["benchmarks/real_vllm_base.py"] if real_vllm else ["-m", "demo", "base"]
    out = subprocess.run([sys.executable, *script], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    found: list[str] = re.findall(r"\S+@sha256:[0-9a-f]{64}", out)
    return found[-1]


def write_pins(work: Path, mirrors: Path, prs: dict[str, int], base: str, real_vllm: bool) -> Path:
    from demo.make_stack import make_stack

    demo = yaml.safe_load((ROOT / "pins" / "demo.yaml").read_text())
    data = {key: demo[key] for key in ("schema_version", "recipe", "acceptance")}
    data["name"] = "real-vllm-megatron-verl" if real_vllm else "real-megatron-verl"
    data["image"] = {"repository": "127.0.0.1:5000/real/unified", "tags": ["real"]}
    data["base"] = {**demo["base"], "image": base}
    if real_vllm:
        data["components"] = {"vllm": {
            "url": PUBLIC["vllm"], "target": "main", "pr": prs["vllm"],
            "commit": git_head(mirrors / MIRROR_NAMES["vllm"], f"refs/pull/{prs['vllm']}/head"),
            "distribution": VLLM["distribution"], "modules": VLLM["modules"],
            "install": {"pip_args": VLLM["pip_args"], "env": {}},
            "native": VLLM["native"], "base_torch": VLLM["base_torch"]}}
        data["direct_urls"] = VLLM_DIRECT_URLS
    else:
        stack = work / "demo-stack"
        make_stack(stack)
        data["components"] = {"vllm": dict(demo["components"]["vllm"], url=str(stack / "tinyengine.git"))}
    for name, spec in COMPONENTS.items():
        mirror = mirrors / MIRROR_NAMES[name]
        data["components"][name] = {
            "url": PUBLIC[name], "target": "main", "pr": prs[name],
            "commit": git_head(mirror, f"refs/pull/{prs[name]}/head"),
            "distribution": spec["distribution"], "modules": spec["modules"],
            "install": {"pip_args": spec["pip_args"], "env": {}}}
    data["compat"] = ([c for c in demo.get("compat", []) if c["package"] != "tinyengine"] if real_vllm
                      else demo.get("compat", [])) + [COMPAT_TRITON]
    data["build"] = {"env": demo["build"].get("env", {}), "lock": "locks/real.lock", "constraints": ["torch"]}
    data["acceptance"] = {**data["acceptance"], "required_gates": ["provenance"]}
    (work / "locks").mkdir(exist_ok=True)
    pins = work / "pins.yaml"
    pins.write_text(yaml.safe_dump(data, sort_keys=False))
    return pins


def write_git_config(work: Path, mirrors: Path) -> Path:
    """insteadOf rules: every public URL of a mirror that DIR holds (components and native inputs)."""
    urls = {url: mirrors / MIRROR_NAMES[name] for name, url in PUBLIC.items()}
    urls["https://github.com/uxlfoundation/oneDNN.git"] = mirrors / MIRROR_NAMES["onednn"]
    urls.update({url: mirrors / name for url, name in CUDA_INPUTS.items()})
    rules = "".join(f'[url "{path}"]\n\tinsteadOf = {url}\n' for url, path in urls.items() if (path / "HEAD").exists())
    path = work / "mirrors.gitconfig"
    path.write_text(rules)
    return path


def builder(args: list[str], env: dict[str, Any], log: Path) -> tuple[int, float, str]:
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


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], check=False, capture_output=True, text=True)


class Clock:
    """Each step's wall time, printed as it ends."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def run(self, step: str, fn, *args):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.times[step] = time.perf_counter() - start
            say(f"time        {step}: {self.times[step]:.1f} s")


def ensure_vllm_repo(mirrors: Path, work: Path, version: str) -> None:
    """DIR/vllm-<version>.git from that vLLM sdist on pip's configured index, unless it is there."""
    if (mirrors / real_vllm.repo_name(version) / "HEAD").exists():
        return
    subprocess.run([sys.executable, "benchmarks/real_vllm.py", "--mirrors", str(mirrors), "--work", str(work),
                    "--version", version], cwd=ROOT, check=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mirrors", type=Path, required=True)
    ap.add_argument("--vllm", choices=["real", "demo"], default="real",
                    help="real: vLLM from its newest sdist, cpu target (default); demo: tinyengine")
    ap.add_argument("--vllm-version", help="default: the newest on pip's configured index (0.33.0 conflicts with verl #7369 on"
                    " transformers; 0.31.0 is the newest that does not)")
    ap.add_argument("--megatron-pr", type=int, default=6772)
    ap.add_argument("--verl-pr", type=int, default=7369)
    ap.add_argument("--base")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "real-repos")
    ap.add_argument("--compare-resolvers", action="store_true", help="also time pip's resolver against uv")
    ap.add_argument("--cuda-inputs-only", action="store_true", help="only list vLLM's CUDA native inputs")
    ap.add_argument("--lock-only", action="store_true", help="stop after the lock")
    args = ap.parse_args()
    mirrors, work = args.mirrors.resolve(), args.work.resolve()
    real = args.vllm == "real"
    work.mkdir(parents=True, exist_ok=True)
    clock = Clock()
    if real:
        version = args.vllm_version or real_vllm.newest_version()
        MIRROR_NAMES["vllm"] = real_vllm.repo_name(version)
        clock.run(f"vllm {version} repo from its sdist", ensure_vllm_repo, mirrors, work, version)
    for key, name in MIRROR_NAMES.items():
        if (real or key not in REAL_ONLY) and not (mirrors / name / "HEAD").exists():
            raise SystemExit(f"--mirrors: expected a bare repository {mirrors / name}")
    env = {**os.environ, "BUILDER_GIT_CONFIG": str(write_git_config(work, mirrors))}
    base = clock.run("base image", base_ref, args.base, real)
    prs = {"vllm": real_vllm.PR_NUMBER, "megatron": args.megatron_pr, "verl": args.verl_pr}
    pins = write_pins(work, mirrors, prs, base, real)
    if args.cuda_inputs_only:
        return cuda_inputs(pins, mirrors, env, clock)
    vllm_pr = f"vllm {vllm_tag(mirrors)} + PR #{prs['vllm']}, " if real else ""
    say(f"pins        {pins} ({vllm_pr}megatron #{args.megatron_pr}, verl #{args.verl_pr}, base {base})")

    rc, t_lock, _ = clock.run("lock", builder, ["lock", str(pins), "--build-sdists"], env, work / "lock.log")
    lock = work / "locks" / "real.lock"
    if rc != 0 or not lock.exists():
        say("lock        FAILED")
        return 1
    entries = lock_entries(lock)
    say(f"lock        {lock.stat().st_size} bytes, {len(entries)} wheels, {t_lock:.1f} s")
    for line in lock_notes(lock):
        say(f"lock        {line}")
    if args.compare_resolvers:
        compare_resolvers(pins, env, work)
    if args.lock_only:
        return 0

    rc, t_build, out = clock.run("build", builder, ["build", str(pins), "--quiet"], env, work / "build.log")
    if rc != 0:
        say(f"build       FAILED after {t_build:.1f} s (log {work / 'build.log'})")
        return 1
    image = json.loads(out)["image_id"]
    size = int(docker("image", "inspect", "-f", "{{.Size}}", image).stdout.strip() or 0)
    say(f"build       {t_build:.1f} s, image {image[:19]}, {size / 1e9:.2f} GB")

    rc, t_gate, _ = clock.run("provenance gate", builder, ["accept", str(pins), "--image", image, "--gate",
                                                           "provenance", "--out", str(work / "run")],
                              env, work / "accept.log")
    report = json.loads((work / "run" / "report.json").read_text()) if (work / "run" / "report.json").exists() else {}
    gate: dict[str, Any] = next((g for g in report.get("gates", []) if g["name"] == "provenance"), {})
    say(f"provenance  {gate.get('status', 'not run')} ({t_gate:.1f} s) {gate.get('reason', '')}".rstrip())

    modules = ["vllm", "megatron.core", "verl"] if real else ["megatron.core", "verl"]
    vllm_probe = "import vllm._C; print('vllm', vllm.__version__, vllm._C.__file__); " if real else ""
    probe = (f"import {', '.join(modules)}; " + vllm_probe
             + "print('megatron.core', megatron.core.__version__, 'verl', verl.__version__)")
    python = yaml.safe_load(pins.read_text())["base"].get("python_bin", "python")
    proc = clock.run("imports", docker, "run", "--rm", "--network", "none", image, python, "-c", probe)
    result = proc.stdout.strip().replace("\n", "; ") if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]
    say(f"imports     {'ok' if proc.returncode == 0 else 'FAILED'} ({clock.times['imports']:.1f} s): {result}")
    if real:
        cuda_inputs(pins, mirrors, env, clock)
    say(f"summary     lock {lock.stat().st_size} B / {len(entries)} wheels, build {t_build:.1f} s, "
        f"image {size / 1e9:.2f} GB, provenance {gate.get('status', 'not run')}, "
        f"imports {'ok' if proc.returncode == 0 else 'failed'}")
    return 0 if rc == 0 and proc.returncode == 0 else 1


# What reading vLLM 0.33.0's CMake by hand finds for the cuda target (/work/notes/vllm_inputs.md): the
# listing says which of them the lock's discovery did not find.
CUDA_ARCH = ["9.0a", "10.0a"]  # Hopper, Blackwell (pins/nemotron-3.5-lightning.yaml)
CUDA_EXPECTED = ["cutlass", "triton_kernels", "deepgemm", "deepselect", "fmha_sm100", "flashmla", "flashkda",
                 "qutlass", "tml_fa4", "vllm-flash-attn"]


def cuda_inputs(pins: Path, mirrors: Path, env: dict[str, Any], clock: Clock) -> int:
    """The native inputs the lock finds for vLLM's cuda target (nothing built): the lock's discovery
    (builder.lock.native) on the pins with vLLM's target switched to cuda, each input resolved to a
    commit as the lock does it (through DIR's mirror of its URL); an input DIR has no mirror of is
    named with its tag and 'not resolved: no mirror'."""
    import pygit2  # lazy: only this listing reads git objects in-process

    from builder.core.errors import BuilderError
    from builder.core.options import Settings
    from builder.lock import native
    from builder.pins import model
    from builder.sources import cmakefetch

    data = yaml.safe_load(pins.read_text())
    data["components"]["vllm"]["native"] = {**data["components"]["vllm"]["native"], "device": "cuda",
                                            "cuda_arch": CUDA_ARCH}
    # only discovery reads these pins: the lock they name need not be one (it must exist to load)
    data["build"]["lock"] = "locks/cuda-listing.lock"
    (pins.parent / "locks").mkdir(exist_ok=True)
    (pins.parent / "locks" / "cuda-listing.lock").touch()
    cuda = pins.with_name("pins-cuda.yaml")
    cuda.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = model.load(cuda)
    repo = pygit2.Repository(str(mirrors / MIRROR_NAMES["vllm"]))
    commit = loaded.components["vllm"].commit
    try:
        found = clock.run("cuda inputs: discovery", cmakefetch.discover_at, repo, commit,
                          native.known_vars(loaded.components["vllm"]), native.build_env(loaded, "vllm")).declarations
    except BuilderError as exc:
        say(f"cuda inputs FAILED: {exc}")
        return 1
    settings = Settings.from_env(env)
    say(f"cuda inputs {len(found)} found at vllm {commit[:12]} (target cuda, arch {' '.join(CUDA_ARCH)}; not built):")
    for decl in found:
        say(f"  {decl.name} {decl.git_repository} GIT_TAG {decl.git_tag} -> "
            f"{resolve_input(settings, mirrors, decl, clock)}  [via {decl.receive}; {decl.file}]")
    missing = [name for name in CUDA_EXPECTED if name not in {d.key for d in found}]
    if missing:
        say(f"  in vLLM's CMake but not found by the lock: {', '.join(missing)}")
    return 0 if not missing else 1


def resolve_input(settings, mirrors: Path, decl, clock: Clock) -> str:  # type: ignore[no-untyped-def]
    """commit (and tree) of a native input as the lock resolves it, or why not."""
    from builder.core.errors import BuilderError
    from builder.lock import native

    sha = re.fullmatch(r"[0-9a-f]{40}", decl.git_tag) is not None
    pinned = f"commit {decl.git_tag} as pinned in its CMake, " if sha else ""
    name = CUDA_INPUTS.get(decl.git_repository)
    if name is None or not (mirrors / name / "HEAD").exists():
        return f"{pinned}not resolved: no mirror"
    ref = decl.git_tag if sha else f"refs/tags/{decl.git_tag}"
    if subprocess.run(["git", "--git-dir", str(mirrors / name), "cat-file", "-e", f"{ref}^{{commit}}"],
                      capture_output=True, check=False).returncode != 0:
        newest = subprocess.run(["git", "--git-dir", str(mirrors / name), "log", "-1", "--all", "--format=%cs"],
                                capture_output=True, text=True, check=False).stdout.strip()
        return f"{pinned}not resolved: {'commit' if sha else 'tag'} not in the mirror (its snapshot ends {newest})"
    try:
        item = clock.run(f"cuda inputs: {decl.name}", native.resolve_input, settings, "vllm", PUBLIC["vllm"], decl)
    except BuilderError as exc:
        why = str(exc).split(": ", 2)[-1]
        if "corruption" in why or "index-pack" in why:
            why = f"the mirror snapshot of it or of a submodule misses objects ({why.strip()[:80]})"
        return f"{pinned}not resolved: {why}"
    return f"commit {item.commit} tree {item.tree}"


def vllm_tag(mirrors: Path) -> str:
    tags = subprocess.run(["git", "--git-dir", str(mirrors / MIRROR_NAMES["vllm"]), "tag", "--list", "v*"], check=True,
                          capture_output=True, text=True).stdout.split()
    return tags[-1]


def lock_notes(lock: Path) -> list[str]:
    """The lock's lines about native inputs, relaxed pins and mapped direct URLs (its comments)."""
    keep = ("native", "relaxed", "direct url", "direct-url")
    return [line.lstrip("# ").rstrip() for line in lock.read_text().splitlines()
            if line.startswith("#") and any(k in line.lower() for k in keep)]


def compare_resolvers(pins: Path, env: dict[str, Any], work: Path, runs: int = 2) -> None:
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
