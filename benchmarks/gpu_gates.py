"""The acceptance gates on a real GPU, without Docker (the lent GPU machine has none). Not a CI test.

    python benchmarks/gpu_gates.py prepare OUT   # here: the demo stack at pins/demo.yaml's commits, exported
                                                 # (pygit2), with the suite's gate settings and build wheels
    python OUT/gpu_gates.py run OUT              # there: a venv with the device's torch, the three components
                                                 # installed from the exported trees, then the gates

`run` checks each exported tree against the pinned commit's git tree hash, installs the components into a
venv that sees the device's own torch, and runs the zero-update, rl-step and control gates with the suite's
own code (acceptance/__main__.run_gate: recipe, log parsing, decisions, checkpoint evidence), then the
performance gate's interleaved runs (acceptance.perf.decide). It prints per-arm diff_max, k3, weight
evidence and throughput, and a kernel check: which of the engine's kernels give a row a different result
alone than inside a batch (the control arm's cuBLAS GEMM should; the batch-invariant ones must not).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from builder.pins.model import Pins

HERE = Path(__file__).resolve().parent
COMPONENTS = {"vllm": "tinyengine", "megatron": "tinycore", "verl": "tinyrl"}
BUILD_WHEELS = ("setuptools_scm-", "vcs_versioning-", "cmake-", "ninja-")  # cmake/ninja: tinyengine's _kernels


# ---------------------------------------------------------------- here: prepare


def prepare(out: Path) -> None:
    root = HERE.parent
    sys.path.insert(0, str(root))
    import pygit2  # lazy: only the prepare step needs it (the GPU machine has none)

    from builder.gating.settings import GateSettings
    from builder.pins import model as pins_mod
    from builder.sources import scmversion
    from demo.make_stack import make_stack

    if out.exists():
        shutil.rmtree(out)
    (out / "src").mkdir(parents=True)
    stack = out / "stack"
    make_stack(stack)
    pins = pins_mod.load(root / "pins" / "demo.yaml")
    record = {}
    for name, comp in pins.components.items():
        repo = pygit2.Repository(str(stack / Path(comp.url).name))
        commit = repo[comp.commit].peel(pygit2.Commit)
        dest = out / "src" / comp.distribution
        _export(repo, commit.tree, dest)
        record[name] = {"distribution": comp.distribution, "commit": comp.commit, "tree": str(commit.tree_id),
                        "version": scmversion.component_version(repo, comp.commit)}
    native = _export_native(pins, stack, out)
    shutil.rmtree(stack)
    settings = {g: GateSettings.of(pins).wire(g) for g in ("zero_update", "rl_step", "control", "performance")}
    (out / "stack.json").write_text(json.dumps({"components": record, "settings": settings, "native": native},
                                               indent=2) + "\n")
    wheels = out / "wheels"
    wheels.mkdir()
    cache = Path(os.environ.get("BUILDER_CACHE", root / ".cache")) / "wheels"
    for prefix in BUILD_WHEELS:
        found = sorted(cache.rglob(f"{prefix}*.whl"))
        if not found:
            raise SystemExit(f"no {prefix}*.whl under {cache} (run `builder lock` for the demo first)")
        shutil.copy(found[-1], wheels)
    shutil.copytree(root / "acceptance", out / "acceptance", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(Path(__file__), out / "gpu_gates.py")
    print(json.dumps(record, indent=2))


def _export_native(pins: Pins, stack: Path, out: Path) -> list[dict[str, Any]]:
    """The lock's native inputs (CMake FetchContent sources) at their locked commits, as the image build
    supplies them: out/native/<component>/<name>, handed over through the recorded variable."""
    import pygit2  # lazy: only the prepare step needs it

    from builder.lock import native as native_mod

    found = []
    for item in native_mod.parse(pins.lock_path().read_text(), str(pins.lock_path())).inputs:
        if item.when or not item.receive.endswith("_SRC_DIR"):
            continue  # conditional inputs (the cuda-only kernels) are not part of the cpu-target lock
        repo = pygit2.Repository(str(stack / Path(item.url).name))
        commit = repo[item.commit].peel(pygit2.Commit)
        if str(commit.tree_id) != item.tree:
            raise SystemExit(f"native input {item.name}: commit {item.commit[:12]} has tree {commit.tree_id},"
                             f" the lock says {item.tree}")
        _export(repo, commit.tree, out / "native" / item.component / item.name)
        found.append({"component": item.component, "name": item.name, "commit": item.commit, "tree": item.tree,
                      "receive": item.receive})
    return found


def _export(repo: Any, tree: Any, dest: Path) -> None:  # pygit2 objects (untyped)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in tree:
        obj = repo[entry.id]
        if entry.type_str == "tree":
            _export(repo, obj, dest / entry.name)
        else:
            (dest / entry.name).write_bytes(obj.data)


# ---------------------------------------------------------------- there: run


def git_tree(path: Path) -> str:
    """The git tree hash of a directory of regular files (mode 100644, as the demo stack writes them)."""
    entries = []
    for item in path.iterdir():
        if item.is_dir():
            entries.append((item.name + "/", b"40000 " + item.name.encode() + b"\0" + bytes.fromhex(git_tree(item))))
        else:
            data = item.read_bytes()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()
            entries.append((item.name, b"100644 " + item.name.encode() + b"\0" + blob))
    body = b"".join(e for _, e in sorted(entries))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def sh(*argv: object, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(f"FAILED {' '.join(map(str, argv))[:200]}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-3000:]}",
              flush=True)
        raise SystemExit(1)
    return done.stdout


def install(out: Path, work: Path) -> str:
    """A venv that sees the device's torch (a .pth to its site-packages), with the three components."""
    import torch

    stack = json.loads((out / "stack.json").read_text())["components"]
    for name, comp in stack.items():
        tree = git_tree(out / "src" / comp["distribution"])
        ok = "matches" if tree == comp["tree"] else f"DIFFERS from the pinned commit's tree {comp['tree']}"
        print(f"{name}: {comp['distribution']} {comp['version'] or ''} at {comp['commit'][:12]}: tree {tree[:12]} {ok}")
        if tree != comp["tree"]:
            raise SystemExit("exported tree is not the pinned commit's")
    venv = work / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv)
    py = venv / "bin" / "python"
    site = Path(sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    torch_site = Path(torch.__file__).resolve().parent.parent
    (site / "device_torch.pth").write_text(f"{torch_site}\n")  # the device's own torch and its libraries
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-index", "--no-deps",
           "--prefix", str(venv)]
    sh(*pip, *sorted((out / "wheels").glob("*.whl")))
    inputs_of: dict[str, list[dict[str, Any]]] = {}
    for item in json.loads((out / "stack.json").read_text()).get("native", []):
        inputs_of.setdefault(item["component"], []).append(item)
    for name, comp in stack.items():
        src = work / "build" / comp["distribution"]
        shutil.copytree(out / "src" / comp["distribution"], src)
        env = dict(os.environ, PYTHONPATH=str(site), PATH=f"{venv / 'bin'}:{os.environ.get('PATH', '')}")
        for item in inputs_of.get(name, []):
            src_dir = out / "native" / name / item["name"]
            if git_tree(src_dir) != item["tree"]:
                raise SystemExit(f"native input {item['name']}: exported tree is not the locked one")
            env[item["receive"]] = str(src_dir)
            print(f"{name}: native input {item['name']} at {item['commit'][:12]} via {item['receive']}")
        if comp["version"]:
            env["SETUPTOOLS_SCM_PRETEND_VERSION_FOR_" + comp["distribution"].upper()] = comp["version"]
        sh(*pip, "--no-build-isolation", src, env=env)
    versions = sh(py, "-c", "import importlib.metadata as m, torch; print(' '.join(f'{d} {m.version(d)}' for d in "
                  "('tinyengine', 'tinycore', 'tinyrl')), '| torch', torch.__version__, torch.version.cuda, "
                  "torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')")
    print("venv:", versions.strip())
    return str(py)


def settings_for(out: Path, work: Path, py: str, gate: str) -> dict[str, Any]:
    base = json.loads((out / "stack.json").read_text())["settings"][gate]
    model = work / "model"
    settings = dict(base)
    settings["entry"] = [py, "-m", "tinyrl.main_ppo"]
    settings["overrides"] = {**base["overrides"], "actor_rollout_ref.model.path": str(model)}
    settings["work_dir"] = str(work / "acceptance")
    # a compile cache of its own per gate, empty at start: the gate lists what the run compiled into it
    cache = work / "cache" / gate
    settings["cache_dir"] = str(cache)
    settings["env"] = {**(base.get("env") or {}), "TRITON_CACHE_DIR": str(cache / "triton")}
    settings["weights"] = "checkpoint"
    settings["process_records"] = False  # no image here: no manifest and no start-up hook to judge processes by
    settings["checkpoint"] = {"overrides": {"trainer.save_freq": 1,
                                            "actor_rollout_ref.actor.checkpoint.save_contents": ["hf_model"]},
                              "dir_key": "trainer.default_local_dir", "dir": str(work / "checkpoints"),
                              "layout": "global_step_{step}/actor/huggingface", "model_path": str(model),
                              "may_stay": []}
    return settings


def summary(result: dict[str, Any]) -> dict[str, Any]:
    ev = result["evidence"]
    steps = ev.get("steps") or {}
    weights = ev.get("weights") or {}
    shots = [f"{s.get('label')}: {(s.get('digest') or '')[:16] or s.get('error')} ({s.get('tensors')} tensors)"
             for s in weights.get("snapshots", [])] if isinstance(weights, dict) else weights
    for key in ("first_differences", "changes", "unchanged_tensors"):
        if isinstance(weights, dict) and weights.get(key):
            shots.append({key: weights[key] if key != "changes" else str(weights[key])[:300]})
    return {"status": result["status"], "reason": result["reason"],
            "diff_max": {k: v.get("diff_max") for k, v in steps.items()},
            "k3_kl": {k: v.get("k3_kl") for k, v in steps.items()},
            "weights_checksums": {k: [v.get("weights_before"), v.get("weights_after")] for k, v in steps.items()},
            "checkpoint_shots": shots, "throughput": ev.get("throughput"), "seconds": ev.get("seconds")}


KERNEL_CHECK = r'''
import json, torch
from tinycore import TinyCore
from tinycore import aligned
from tinyengine import batch_invariant as bi, batched
from tinyengine.config import ModelConfig
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
cfg = ModelConfig()
model = TinyCore(seed=1).to(dev)
p = {k: v.detach() for k, v in model.named_parameters()}
g = torch.Generator(device="cpu").manual_seed(0)
x = torch.randn(256, cfg.d_model, generator=g).to(dev)
w = p["layers.0.mlp.w_in"]
def rows_alone_vs_batch(f):
    full = f(x)
    alone = torch.cat([f(x[i:i + 1]) for i in range(x.shape[0])])
    diff = (full - alone).abs().max().item()
    rows = int((full != alone).any(-1).sum().item())
    return {"max_abs_diff": diff, "rows_differing": rows, "of": x.shape[0]}
out = {
  "cublas x @ W (control arm linear)": rows_alone_vs_batch(lambda t: t @ w),
  "batch_invariant.linear": rows_alone_vs_batch(lambda t: bi.linear(t, w)),
  "batch_invariant.rms_norm": rows_alone_vs_batch(lambda t: bi.rms_norm(t, p["norm.weight"], cfg.eps)),
  "batch_invariant.log_softmax": rows_alone_vs_batch(lambda t: bi.log_softmax(t)),
  "torch.log_softmax (control arm)": rows_alone_vs_batch(lambda t: torch.log_softmax(t, -1)),
}
# engine (batch-invariant prefill of 32 rows) vs the trainer's aligned forward, position by position
tokens = torch.randint(0, cfg.vocab_size, (32, 16), generator=g).to(dev)
_, eng = bi.prefill(p, cfg, tokens[:, :8])
with torch.no_grad():
    tr = aligned.sequence_logprobs(p, cfg, tokens[:, :9])[:, -1]
eng_tok = eng.gather(1, tokens[:, 8:9])[:, 0]
out["engine prefill vs trainer aligned (logprob of token 9)"] = {"max_abs_diff": (eng_tok - tr).abs().max().item(),
    "rows_differing": int((eng_tok != tr).sum().item()), "of": 32}
_, engb = batched.prefill(p, cfg, tokens[:, :8])
engb_tok = engb.gather(1, tokens[:, 8:9])[:, 0]
out["engine batched (cuBLAS) vs trainer aligned"] = {"max_abs_diff": (engb_tok - tr).abs().max().item(),
    "rows_differing": int((engb_tok != tr).sum().item()), "of": 32}
print(json.dumps(out))
'''


def run(out: Path, repeats: int) -> int:
    sys.path.insert(0, str(out))
    from acceptance import decide, gpu, perf, recipe
    from acceptance.__main__ import plain, run_gate

    started = time.time()
    print("gpu:", json.dumps(gpu.facts()))
    import sysconfig

    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    print(f"python {sys.version.split()[0]} at {sys.executable}; {header} {'present' if header.exists() else 'MISSING'};"
          f" cc {shutil.which('cc') or shutil.which('gcc') or 'MISSING'}", flush=True)
    work = Path("/tmp/gpu-gates")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    py = install(out, work)
    sh(py, "-m", "tinyrl.init_model", work / "model", "1")
    results = {}
    for gate in ("zero_update", "rl_step", "control"):
        result = cast("dict[str, Any]", plain(run_gate(gate, settings_for(out, work, py, gate))))
        results[gate] = summary(result)
        print(f"\n== {gate}: {result['status']}: {result['reason']}")
        print(json.dumps(results[gate], default=str))
        jit = result["evidence"].get("jit") or {}
        print(f"jit ({gate}): cache at start {jit.get('at_start')}; {jit.get('count')} entries; kernels {jit.get('kernels')}")
        for entry in (jit.get("entries") or [])[:8]:
            print("  ", json.dumps({k: entry.get(k) for k in ("kernel", "cache_key", "compiler_version", "target",
                                                               "config", "ttir_sha256", "origin", "file")}))
        if result["status"] != "pass":
            print("log tail:", result.get("log", "")[-1500:])
        found = result["evidence"].get("replay") or {}
        print(f"replay ({gate}): " + (f"bundle: step {found.get('step')}, {found.get('kind')} differ at "
                                      f"{found.get('count')} position(s), first {(found.get('first') or [None])[0]}"
                                      if found.get("differs") else str(found.get("note"))))
        if found.get("differs"):  # replay it here, as `builder replay` does in a container
            bundle = work / f"replay_{gate}.json"
            bundle.write_text(json.dumps(found))
            start = time.time()
            again = subprocess.run([py, "-m", "acceptance", "replay", "--bundle", str(bundle)], capture_output=True,
                                   text=True, env={**os.environ, "PYTHONPATH": str(out)})
            print(f"replay ({gate}) rerun: exit {again.returncode} in {time.time() - start:.1f} s: "
                  f"{again.stdout.strip()[:400]} {again.stderr.strip()[-400:]}")
    stack_settings = json.loads((out / "stack.json").read_text())["settings"]["performance"]
    spec = stack_settings.get("performance") or {}
    min_ratio, max_spread = spec.get("min_ratio", 0.1), spec.get("max_spread", 1.5)
    steps = spec.get("steps") or stack_settings["steps"]
    metrics = [spec.get("metric") or "perf/rollout_tokens_per_s", "perf/rollout_tokens_per_s"]
    runs: dict[str, Any] = {m: {"aligned": [], "control": []} for m in metrics}
    for index in range(1, repeats + 1):
        for arm in ("aligned", "control"):
            settings = {**settings_for(out, work, py, "performance"), "arm": arm, "steps": steps}
            run_, _, _ = recipe.run(settings, "rl_step" if arm == "aligned" else "control")
            for metric in metrics:
                status, reason, ev = decide.performance_run(run_, steps, metric, arm)
                runs[metric][arm].append(ev["throughput"])
                print(f"performance {arm} run {index}: {status}: {reason}")
    for metric in metrics:
        rule = perf.Rule(min_ratio=min_ratio, max_spread=max_spread, max_pairs=repeats)
        status, reason, _ = perf.decide(runs[metric]["aligned"], runs[metric]["control"], rule, metric)
        print(f"\n== performance on {metric} (the demo pins' CPU-measured min_ratio {min_ratio}, max_spread"
              f" {max_spread}): {status}: {reason}")
    print("\n== kernels: a row computed alone vs inside a batch of 256, and engine vs trainer (GPU)")
    for name, value in json.loads(sh(py, "-c", KERNEL_CHECK)).items():
        print(f"{name}: {json.dumps(value)}")
    print("\n== per arm")
    for gate, arm in (("zero_update", "aligned, lr 0"), ("rl_step", "aligned"), ("control", "control")):
        r = results[gate]
        print(f"{gate:12s} {arm:14s} {r['status']:12s} diff_max {r['diff_max']} k3 {r['k3_kl']} "
              f"throughput {r['throughput']}")
    print(f"\nwall {time.time() - started:.1f} s")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "prepare":
        prepare(Path(argv[1]).resolve())
        return 0
    if len(argv) >= 2 and argv[0] == "run":
        return run(Path(argv[1]).resolve(), int(argv[2]) if len(argv) > 2 else 3)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
