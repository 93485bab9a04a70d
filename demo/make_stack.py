"""Generate the demo stack: three bare git repositories with fixed, reproducible history.

    python demo/make_stack.py OUTDIR

Writes OUTDIR/{tinyengine,tinycore,tinyrl,tinykernels}.git and OUTDIR/stack.json. Every commit is
built from the overlay directories under demo/src/<repo>/ (a commit's tree = its
parent's tree plus the overlay's files) with a fixed author, committer and date, so
the SHAs are identical on every machine and on every run. Objects are written with
pygit2 directly (no working tree, no git config involved); re-running on an existing
OUTDIR resets the refs to the same commits.
"""
import json
import os
import sys
from pathlib import Path
from typing import Any

import pygit2

SRC = Path(__file__).resolve().parent / "src"
AUTHOR = ("Demo Stack", "demo-stack@example.invalid")
BASE_TIME = 1735725600  # 2025-01-01T10:00:00Z; commit k of repo r is at BASE + r days + k hours
SKIP = ("__pycache__", ".pyc", ".so", ".egg-info", ".o")
# (role, commits as (id, parent id, overlay folder, message), main's commit id, PRs as {number: (...)})
Spec = tuple[str, list[tuple[str, str | None, str, str]], str, dict[int, tuple[str, str, str | None]]]

# name: (role, [(commit id, parent id, overlay dir, message)], main head, {pr: (head id, title, defect or None)})
# Annotated release tags {repo: {tag: commit id}}: tinyengine's version comes from them (setuptools-scm).
TAGS = {"tinyengine": {"v0.2.0": "e3"}, "tinykernels": {"v0.1.0": "k1", "v0.2.0": "k2"}}
TAG_HOUR = {"tinyengine": 8, "tinycore": 8, "tinyrl": 9, "tinykernels": 8}  # tag times fixed: later commits keep the tags
REPOS: dict[str, Spec] = {
    "tinyengine": ("vllm", [
        ("e1", None, "e1-initial", "Initial tinyengine: tiny decoder-only model, batched KV-cache generation\n\n"
         "Seeded per-row sampling returning the logprob of each sampled token,\n"
         "load_weights() for weight sync, native module tinyengine._C."),
        ("e2", "e1", "e2-docs", "Add CHANGELOG"),
        ("e3", "e2", "e3-weights-check", "weights: native FNV-1a fingerprint of the resident weights"),
        ("p11a", "e3", "p11-1-kernels", "Add batch-invariant kernels\n\n"
         "Vectorised, with a fixed reduction order per output: linear = elementwise product\n"
         "and a sum over the input dim, attention over all max_seq_len key slots (masked).\n"
         "Native part tinyengine._kernels built with CMake, fetching tinykernels v0.1.0."),
        ("p11b", "p11a", "p11-2-switch", "engine: DEMO_BATCH_INVARIANT selects the batch-invariant kernels\n\n"
         "Read once at construction and recorded as LLM.batch_invariant\n"
         "(the counterpart of VLLM_BATCH_INVARIANT)."),
        ("e4", "e3", "e4-main-later", "docs: per-row sampling seeds"),
        ("p12", "p11b", "p12-defect", "engine: always use the batched kernels (faster)"),
        ("p13", "p11b", "p13-defect", "weights: skip the copy when weights are already resident"),
        ("p11c", "p11b", "p11-3-cuda", "engine: run on the first GPU when torch sees one (DEMO_DEVICE overrides)\n\n"
         "Batched path: plain cuBLAS GEMMs. Batch-invariant path on the GPU: Triton kernels with one fixed\n"
         "configuration each (matmul: a multiply-add chain over k in order; RMS norm, softmax: one fixed tree\n"
         "per row), so every sum has a fixed reduction order (no cuBLAS, no library reduction).\n"
         "Sampling stays on the CPU with the per-row generators."),
        ("p14", "p11c", "p14-slow", "batch_invariant: recompute the prefix at each decode step (no KV cache)\n\n"
         "Every token goes through the prefill path: batch-invariant by construction."),
        ("p15", "p11c", "p15-defect", "kernels: extra helpers from tinyextra (declared in csrc/extra)"),
        ("p16", "p11c", "p16-selfcheck", "batch_invariant: check each decode step's MLP against a second pass\n\n"
         "A determinism self-check of the fixed reduction order: still exact, about 1.2x the decode CPU time."),
    ], "e4", {
        11: ("p11c", "Batch-invariant inference (DEMO_BATCH_INVARIANT)", None),
        12: ("p12", "Batch-invariant inference, faster path", "batch invariance broken: the switch is read "
             "and recorded but the batched kernels are still used"),
        13: ("p13", "Batch-invariant inference, cheaper weight sync", "skips weight reload: load_weights "
             "silently does nothing after the first load"),
        14: ("p14", "Batch-invariant inference without a KV cache", "slow batch-invariant path: every decode "
             "step recomputes the whole prefix; correct, several times slower"),
        15: ("p15", "Batch-invariant inference, extra kernel helpers", "undeclared native input: tinyextra is "
             "fetched from a CMake subdirectory the lock does not read, so the offline build fails naming it"),
        16: ("p16", "Batch-invariant inference with a decode self-check", None),
    }),
    "tinycore": ("megatron", [
        ("c1", None, "c1-initial", "Initial tinycore: full-sequence forward, backward, AdamW\n\n"
         "Same architecture and parameter names as tinyengine (state_dicts are interchangeable)."),
        ("c2", "c1", "c2-utils", "utils: clip_grad_norm and params_checksum"),
        ("c3", "c2", "c3-changelog", "Add CHANGELOG"),
        ("p22a", "c3", "p22-1-aligned", "Add aligned forward reproducing the engine's batch-invariant kernels"),
        ("p22b", "p22a", "p22-2-wire", "model: token_logprobs(aligned=True) uses the aligned forward"),
        ("c4", "c3", "c4-main-later", "docs: weight sync into the engine"),
        ("p23", "p22b", "p23-defect", "optim: simplify decoupled weight decay"),
        ("p24", "p22b", "p24-defect", "optim: do not step a tied output projection twice"),
        ("p22c", "p22b", "p22-3-cuda", "aligned: the engine's Triton kernels on the GPU (same kernels, same order)"),
        # PR 25 with tinyrl PR 43: a defect that needs both (builder bisect's two-repository case)
        ("q1", "p22c", "p25-1-notes", "docs: NOTES.md for the faster linear"),
        ("q2", "q1", "p25-2-fast", "aligned: TINYCORE_FAST_LINEAR=1 takes one GEMM for linear"),
    ], "c4", {
        22: ("p22c", "Aligned forward: training logprobs equal batch-invariant rollout logprobs", None),
        23: ("p23", "Aligned forward, simplified AdamW decay", "weight decay not scaled by lr: "
             "weights change even at lr 0"),
        25: ("q2", "Aligned forward, a faster linear behind a switch", "with tinyrl PR 43 (which sets the switch) the "
             "aligned forward leaves the engine's reduction order: zero_update differs; alone, no change"),
        24: ("p24", "Aligned forward, tied-embedding aware AdamW", "one tensor skipped by the optimizer step: "
             "lm_head.weight is taken for a tied embedding and never changes"),
    }),
    "tinyrl": ("verl", [
        ("r1", None, "r1-initial", "Initial tinyrl: GRPO with tinyengine rollouts and tinycore training\n\n"
         "verl-style overrides (python -m tinyrl.main_ppo key=value), console and JSONL loggers,\n"
         "engine.load_weights(model.state_dict()) after every optimizer step."),
        ("r2", "r1", "r2-docs", "Add CHANGELOG"),
        ("r3", "r2", "r3-reward", "reward: parity rule from the prompt's first token"),
        ("p33a", "r3", "p33-1-metrics", "Add train/rollout mismatch metrics (rollout_probs_diff, rollout_corr)"),
        ("p33b", "p33a", "p33-2-wire", "main_ppo: log mismatch metrics, weight checksums, batch invariance; "
         "aligned forward\n\nold_log_prob uses tinycore's aligned forward when the engine is batch-invariant."),
        ("r4", "r3", "r4-main-later", "Update CHANGELOG"),
        ("p33c", "p33b", "p33-3-checkpoint", "checkpoints: verl's trainer.save_freq, trainer.default_local_dir, "
         "actor.checkpoint.save_contents\n\nglobal_step_<N>/actor/ layout; actor_rollout_ref.model.path loads an "
         "HF-style model dir;\nactor_rollout_ref.actor.weight_checksums=false drops the checksum metrics."),
        ("p34", "p33c", "p34-defect", "metrics: mask padding before the max"),
        ("p35", "p33c", "p35-defect", "metrics: drop the redundant k3 estimator"),
        ("p33d", "p33c", "p33-4-cuda", "main_ppo: trainer on the engine's device (a GPU when present); replay capture\n\n"
         "With REPLAY_CAPTURE_DIR set each step writes its batch, both sides' logprobs and the weights it\n"
         "changed (tinyrl.capture); python -m tinyrl.replay BUNDLE replays one step's comparison alone."),
        ("p36", "p33d", "p36-defect", "reward: score only the non-padding response tokens"),
        ("p33e", "p33d", "p33-5-worker", "rollout: the engine in a worker process (multiprocessing)\n\n"
         "As verl's rollout workers: weights go to the worker after every step, tokens, logprobs and\n"
         "the worker's CPU time come back; runtime_env env_vars are set in the worker. Forked where\n"
         "safe (no CUDA context, one intra-op thread in the trainer), spawned otherwise."),
        ("p37", "p33e", "p37-defect", "rollout: ship a working copy of the engine to the worker (runtime_env)"),
        ("p38", "p33e", "p38-defect", "rollout: JIT-build tinyengine._C with -O3 in the worker"),
        ("p33f", "p33e", "p33-6-remote", "rollout: the engine as a server reached over TCP (tinyrl.rollout_server)\n\n"
         "python -m tinyrl.rollout_server --port P serves the rollout worker's commands to one trainer\n"
         "(multiprocessing.connection, the key in ROLLOUT_AUTHKEY); actor_rollout_ref.rollout.address=HOST:PORT\n"
         "makes the trainer use it instead of its forked worker, as verl's rollout on other nodes."),
        ("p39", "p33f", "p39-defect", "rollout: start the worker as a fresh interpreter from a clean environment"),
        ("p40", "p33f", "p40-defect", "rollout: start the worker with python -S (no site scan), its sys.path by hand"),
        ("p41", "p33f", "p41-defect", "rollout: the worker removes its own stale files (<pid>-*) from the output dirs"),
        ("p47", "p33f", "p47-defect", "rollout: the worker in a runtime environment of its own (a copy of the interpreter)"),
        ("p48", "p33f", "p48-defect", "rollout: the server holds the rollout key: no core dumps of it (PR_SET_DUMPABLE 0)"),
        ("p49", "p33f", "p49-defect", "rollout: the server in a session of its own (preexec_fn), started with -S"),
        # PR 42, a series for `builder bisect` (docs/bisect.md): a build failure at s3 (fixed at s4), the defect at s5
        ("s1", "p33f", "p42-1-notes", "docs: NOTES.md for the bisect series"),
        ("s2", "s1", "p42-2-notes", "docs: the rollout server serves one trainer"),
        ("s3", "s2", "p42-3-packaging", "packaging: ship tinyrl.plugins (the directory is not there yet)"),
        ("s4", "s3", "p42-4-packaging-fix", "packaging: only tinyrl again"),
        ("s5", "s4", "p42-5-defect", "main_ppo: old_log_prob from the plain forward (simpler)"),
        ("s6", "s5", "p42-6-notes", "docs: a note on old_log_prob"),
        ("t1", "p33f", "p43-1-notes", "docs: NOTES.md for the faster linear"),
        ("t2", "t1", "p43-2-fast", "main_ppo: turn on tinycore's faster linear (TINYCORE_FAST_LINEAR=1)"),
        # last in the list: a commit appended here moves no earlier commit's time, so no other SHA moves
        ("p50", "p33f", "p50-defect", "rollout: helper processes beside the engine (warm-up, key holder, session, probe)"),
        ("p51", "p33f", "p51-defect", "rollout: quick checks that the trainer's sys.path imports tinyrl (python -S -I)"),
    ], "r4", {
        33: ("p33f", "Train/rollout mismatch metrics, weight checksums, aligned old_log_prob", None),
        34: ("p34", "Mismatch metrics, padding mask", "NaN metric: training/rollout_probs_diff_max is NaN"),
        35: ("p35", "Mismatch metrics without k3", "missing metric: rollout_corr/k3_kl is not logged"),
        36: ("p36", "Mismatch metrics, reward over non-padding tokens", "NaN reward: the padding mask is "
             "inverted, 0/0 at step 1; the NaN update crashes the step-2 rollout"),
        37: ("p37", "Rollout worker with a shipped engine copy", "overlay in the worker: its runtime_env puts a "
             "copy of tinyengine first on its sys.path; the trainer process imports nothing from it"),
        38: ("p38", "Rollout worker with a faster _C build", "another native build in the worker: it compiles "
             "tinyengine._C itself and loads that instead of the image's"),
        39: ("p39", "Rollout worker from a clean environment", "escape: the worker is a fresh interpreter started "
             "without the job's variables (the recording ones too): it runs the engine and leaves no process record"),
        40: ("p40", "Rollout worker with a faster start (-S)", "escape: the worker's interpreter starts with -S, "
             "so it never loads the image's start-up hook: it runs the engine and leaves no process record"),
        41: ("p41", "Rollout worker that tidies its stale files", "escape: the worker deletes the files named after "
             "its pid in every directory its environment names, its own process record among them"),
        47: ("p47", "Rollout worker in its own runtime environment", "escape: the worker runs on a copy of the "
             "interpreter named rollout-engine in /tmp, outside the venv and its start-up hook: no process record"),
        48: ("p48", "Rollout server without core dumps", "escape: the server turns PR_SET_DUMPABLE off, so the "
             "gate cannot read its exe, maps or fds"),
        49: ("p49", "Rollout server in a session of its own", "escape: preexec_fn makes the hook's fork handler "
             "write a record for the child, which then execs python -S: the record is not the program's"),
        50: ("p50", "Rollout helper processes", "four escapes at once, beside the engine: the base interpreter "
             "through the dynamic loader, a key holder that turns PR_SET_DUMPABLE off, a preexec_fn child that execs "
             "python -S after the fork handler's record, and a 40 ms probe that imports tinyrl: none recorded"),
        51: ("p51", "Rollout import checks", "ten short interpreters (python -S -I, a few ms of work each, far below "
             "the census's polling floor) import tinyrl: none recorded; under Docker the census's fanotify reader "
             "sees each exec"),
        42: ("s6", "A series of small commits (bisect demo)", "old_log_prob from the plain forward at s5 (zero_update "
             "differs); s3 does not build (fixed at s4)"),
        43: ("t2", "The trainer turns on tinycore's faster linear", "with tinycore PR 25 zero_update differs (the "
             "switch is set here, read there); alone, no change"),
    }),
}


# Native inputs (no PRs): fetched by a component's CMake build with FetchContent, by tag.
NATIVE: dict[str, Spec] = {
    "tinykernels": ("native", [
        ("k1", None, "k1-initial", "Initial tinykernels: the kernel switch rule (header only)"),
        ("k2", "k1", "k2-release", "Release 0.2.0"),
    ], "k2", {}),
}


def _overlay(path: Path) -> dict[str, Any]:
    files = {}
    for f in sorted(path.rglob("*")):
        rel = f.relative_to(path).as_posix()
        if f.is_file() and not any(s in rel for s in SKIP):
            files[rel] = f.read_bytes()
    return files


def _tree(repo: Any, files: dict[str, Any]) -> Any:
    """Write a nested tree for {posix path: bytes}; returns its oid (pygit2 objects: untyped)."""
    blobs: dict[str, bytes] = {}
    dirs: dict[str, dict[str, Any]] = {}
    for path, data in files.items():
        head, sep, rest = path.partition("/")
        if sep:
            dirs.setdefault(head, {})[rest] = data
        else:
            blobs[head] = data
    tb = repo.TreeBuilder()
    for name, data in blobs.items():
        tb.insert(name, repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB)
    for name, sub in dirs.items():
        tb.insert(name, _tree(repo, sub), pygit2.GIT_FILEMODE_TREE)
    return tb.write()


def _make_repo(path: Path, index: int, spec: Spec) -> dict[str, Any]:
    role, commits, main, prs = spec
    repo = pygit2.Repository(str(path)) if path.exists() else pygit2.init_repository(str(path), bare=True)
    files_at: dict[str, dict[str, Any]] = {}
    sha: dict[str, str] = {}
    for k, (cid, parent, overlay, message) in enumerate(commits):
        files = dict(files_at[parent]) if parent else {}
        files.update(_overlay(SRC / path.stem / overlay))
        files_at[cid] = files
        when = BASE_TIME + index * 86400 + k * 3600
        sig = pygit2.Signature(AUTHOR[0], AUTHOR[1], when, 0)
        parents = [pygit2.Oid(hex=sha[parent])] if parent else []
        sha[cid] = str(repo.create_commit(None, sig, sig, message + "\n", _tree(repo, files), parents))
    refs = {"refs/heads/main": sha[main]}
    for n, (head, _, _) in prs.items():
        refs[f"refs/pull/{n}/head"] = refs[f"refs/heads/pr-{n}"] = sha[head]
    for name in list(repo.references):
        if name not in refs and name != "HEAD":
            repo.references.delete(name)
    for name, target in sorted(refs.items()):
        repo.references.create(name, pygit2.Oid(hex=target), force=True)
    tagger = pygit2.Signature(AUTHOR[0], AUTHOR[1], BASE_TIME + index * 86400 + TAG_HOUR[path.stem] * 3600, 0)
    for tag, cid in sorted(TAGS.get(path.stem, {}).items()):
        oid = repo.create_tag(tag, pygit2.Oid(hex=sha[cid]), pygit2.enums.ObjectType.COMMIT, tagger, f"Release {tag}\n")
        refs[f"refs/tags/{tag}"] = str(oid)
    repo.references.create("HEAD", "refs/heads/main", force=True)
    main_oid = pygit2.Oid(hex=sha[main])
    pr_info = {}
    for n, (head, title, defect) in prs.items():
        head_oid = pygit2.Oid(hex=sha[head])
        ahead, behind = repo.ahead_behind(head_oid, main_oid)
        pr_info[str(n)] = {
            "ref": f"refs/pull/{n}/head", "head": sha[head], "title": title,
            "description": defect or title, "defect": defect, "good": defect is None,
            "merge_base": str(repo.merge_base(head_oid, main_oid)), "ahead": ahead, "behind": behind,
        }
    if not prs:
        return {"url": path.name, "role": role, "target": "main", "main": sha[main], "refs": refs,
                "tags": {tag: sha[cid] for tag, cid in sorted(TAGS.get(path.stem, {}).items())}}
    good = [n for n, (_, _, d) in prs.items() if d is None][0]
    return {
        "url": path.name, "role": role, "distribution": path.stem, "modules": [path.stem], "target": "main",
        "main": sha[main], "pr": good, "fork_point": pr_info[str(good)]["merge_base"],
        "prs": pr_info, "refs": refs,
    }


def make_stack(outdir: str | Path) -> dict[str, Any]:
    """Create or refresh the three repositories under outdir; returns (and writes to stack.json) all SHAs."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    stack: dict[str, Any] = {"schema": 1, "repos": {}}
    for index, (name, spec) in enumerate(REPOS.items()):
        stack["repos"][name] = _make_repo(outdir / f"{name}.git", index, spec)
    stack["native"] = {name: _make_repo(outdir / f"{name}.git", len(REPOS) + index, spec)
                       for index, (name, spec) in enumerate(NATIVE.items())}
    tmp = outdir / f".stack.json.{os.getpid()}"  # readers in other processes never see half a file
    tmp.write_text(json.dumps(stack, indent=2, sort_keys=True) + "\n")
    tmp.replace(outdir / "stack.json")
    return stack


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: make_stack.py OUTDIR", file=sys.stderr)
        return 2
    stack = make_stack(Path(argv[0]))
    for name, r in stack["native"].items():
        print(f"{name}: main={r['main'][:12]} tags {' '.join(f'{t}={c[:12]}' for t, c in r['tags'].items())}")
    for name, r in stack["repos"].items():
        prs = " ".join(f"#{n}={p['head'][:12]}" for n, p in r["prs"].items())
        print(f"{name}: main={r['main'][:12]} fork_point={r['fork_point'][:12]} {prs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
