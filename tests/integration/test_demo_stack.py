"""The demo stack (demo/make_stack.py): deterministic repositories, and the three packages
behave as the acceptance gates expect (aligned: exact zeros; control: a mismatch; each
planted defect shows its defect)."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pygit2
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from builder.sources import scmversion  # noqa: E402
from demo.make_stack import make_stack  # noqa: E402

REPOS = ("tinyengine", "tinycore", "tinyrl")
GOOD = {"tinyengine": 11, "tinycore": 22, "tinyrl": 33}
DIFF_MAX, DIFF_MEAN, K3 = "training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "rollout_corr/k3_kl"
W_BEFORE, W_AFTER = "actor/weights_checksum_before", "actor/weights_checksum_after"
REQUIRED = [DIFF_MAX, DIFF_MEAN, K3, W_BEFORE, W_AFTER, "actor/lr", "actor/grad_norm", "actor/pg_loss",
            "critic/rewards/mean", "perf/rollout_tokens_per_s", "perf/rollout_tokens_per_cpu_s", "rollout/batch_invariant"]


def _git(*args: str, cwd: str | Path | None = None) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _export(repo_path: Path, commit: str, dest: Path) -> None:
    repo = pygit2.Repository(str(repo_path))

    def walk(tree: Any, base: Path) -> None:  # a pygit2 tree (untyped)
        for entry in tree:
            obj = repo[entry.id]
            if entry.type_str == "tree":
                walk(obj, base / entry.name)
            else:
                (base / entry.name).parent.mkdir(parents=True, exist_ok=True)
                (base / entry.name).write_bytes(obj.data)

    walk(repo[commit].peel(pygit2.Tree), dest)


class Installer:
    """pip-installs a repository at a commit into its own --target dir (cached per commit). Tests that use it
    are marked slow: pip, tinyengine's C extension and torch."""

    def __init__(self, root: Path, outdir: Path, stack: dict[str, Any]) -> None:
        self.root, self.outdir, self.stack = root, outdir, stack
        self.sites: dict[str, Path] = {}

    def site(self, repo: str, pr: int) -> Path:
        commit = self.stack["repos"][repo]["prs"][str(pr)]["head"]
        if commit not in self.sites:
            src, target = self.root / f"src-{repo}-{pr}", self.root / f"site-{repo}-{pr}"
            _export(self.outdir / f"{repo}.git", commit, src)
            # the export has no .git: a version from git tags comes from the tool (like the image build)
            version = scmversion.component_version(pygit2.Repository(str(self.outdir / f"{repo}.git")), commit)
            env = {**os.environ, scmversion.pretend_env_name(repo): version} if version else dict(os.environ)
            if repo == "tinyengine":  # its CMake build fetches tinykernels by tag: hand it a local copy
                kernels = self.root / "tinykernels-v0.1.0"
                if not kernels.exists():
                    _export(self.outdir / "tinykernels.git", self.stack["native"]["tinykernels"]["tags"]["v0.1.0"],
                            kernels)
                env["TINYKERNELS_SRC_DIR"] = str(kernels)
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", "--disable-pip-version-check", "--target", str(target), str(src)],
                           check=True, capture_output=True, text=True, env=env)
            self.sites[commit] = target
        return self.sites[commit]

    def pythonpath(self, **prs: int) -> str:
        return os.pathsep.join(str(self.site(r, prs.get(r, GOOD[r]))) for r in REPOS)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    outdir = tmp_path_factory.mktemp("demo-stack")
    return outdir, make_stack(outdir)


@pytest.fixture(scope="session")
def installer(stack: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Installer:
    return Installer(tmp_path_factory.mktemp("installs"), *stack)


def run_ppo(installer: Installer, tmp_path: Path, bi: int, lr: float, prs: dict[str, int] | None = None,
            extra: tuple[str, ...] | list[str] = (), expect_rc: int = 0) -> tuple[Any, float | None]:
    """(each step's metrics, seconds); (the finished process, None) when a non-zero exit is expected."""
    log = tmp_path / f"metrics-{bi}-{lr}.jsonl"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": installer.pythonpath(**(prs or {})),
           "DEMO_BATCH_INVARIANT": str(bi), "VERL_FILE_LOGGER_PATH": str(log), "HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "tinyrl.main_ppo", "trainer.total_training_steps=2",
            f"actor_rollout_ref.actor.optim.lr={lr}", "trainer.logger=[console,file]",
            "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=true", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == expect_rc, proc.stderr[-3000:]
    if expect_rc:
        return proc, None
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    console = [line for line in proc.stdout.splitlines() if line.startswith("step:")]
    assert len(console) == 2
    for line, rec in zip(console, steps):  # verl's console format, as its CI parses it
        fields = dict(f.split(":", 1) for f in line.split(" - "))
        assert int(fields["step"]) == rec["step"]
        for key, value in rec["data"].items():
            if isinstance(value, float) and not math.isnan(value):
                assert float(fields[key]) == value, key
    return [s["data"] for s in steps], time.perf_counter() - t0


# ---- repositories ---------------------------------------------------------------------------

def test_generation_is_deterministic_and_idempotent(stack: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    _, first = stack
    again = make_stack(tmp_path / "b")
    assert again == first
    assert make_stack(tmp_path / "b") == first  # re-run on an existing OUTDIR
    assert json.loads((tmp_path / "b" / "stack.json").read_text()) == first


def test_refs_history_and_packaging(stack: tuple[Path, dict[str, Any]]) -> None:
    outdir, st = stack
    for name in REPOS:
        info, path = st["repos"][name], outdir / f"{name}.git"
        listed = _git("for-each-ref", "--format=%(refname) %(objectname)", cwd=path).splitlines()
        refs = dict(line.split(" ", 1) for line in listed)
        assert refs == info["refs"]
        assert _git("symbolic-ref", "HEAD", cwd=path).strip() == "refs/heads/main"
        assert int(_git("rev-list", "--count", info["main"], cwd=path)) >= 4
        good = info["prs"][str(GOOD[name])]
        assert info["pr"] == GOOD[name] and good["defect"] is None
        assert good["merge_base"] == info["fork_point"] == _git("merge-base", good["head"], info["main"], cwd=path).strip()
        assert 3 <= good["ahead"] <= 6 and good["behind"] >= 1
        for n, pr in info["prs"].items():
            assert refs[f"refs/pull/{n}/head"] == pr["head"]
            if pr["defect"]:  # commits on top of the good PR's head, or of an earlier commit of it (a series too)
                fork = _git("merge-base", pr["head"], good["head"], cwd=path).strip()
                assert _git("merge-base", fork, info["main"], cwd=path).strip() != fork, (n, fork)
        tree = _git("ls-tree", "-r", "--name-only", good["head"], cwd=path).split()
        assert "pyproject.toml" in tree and f"{name}/__init__.py" in tree
        pyproject = _git("show", f"{good['head']}:pyproject.toml", cwd=path)
        init = _git("show", f"{good['head']}:{name}/__init__.py", cwd=path)
        if name == "tinyengine":  # like vLLM: the version comes from git tags (setuptools-scm)
            assert 'dynamic = ["version"]' in pyproject and "[tool.setuptools_scm]" in pyproject
            assert "from tinyengine._version import __version__" in init
            assert scmversion.component_version(pygit2.Repository(str(path)), good["head"]).startswith("0.2.1.dev")
        else:
            version = pyproject.split('version = "')[1].split('"')[0]
            assert f'__version__ = "{version}"' in init
    assert {n for n in st["repos"]["tinyengine"]["prs"]} == {"11", "12", "13", "14", "15", "16"}
    assert {n for n in st["repos"]["tinycore"]["prs"]} == {"22", "23", "24", "25"}
    assert {n for n in st["repos"]["tinyrl"]["prs"]} == {"33", "34", "35", "36", "37", "38", "39", "40", "41", "42",
                                                         "43", "47", "48", "49", "50", "51"}


# ---- the engine on its own -------------------------------------------------------------------

ENGINE_CHECK = """
import json, torch
from tinyengine import LLM
from tinycore import TinyCore
llm = LLM(); llm.load_weights(TinyCore(seed=3).state_dict())
prompts = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(0))
batch = llm.generate(prompts, max_tokens=8, seed=7)
single = [llm.generate(prompts[i:i + 1], max_tokens=8, seeds=[7 + i]) for i in range(16)]
maps = open("/proc/self/maps").read()
print(json.dumps({"bi": llm.batch_invariant, "native": "tinyengine/_C" in maps,
    "tokens_equal": all(torch.equal(s.tokens[0], batch.tokens[i]) for i, s in enumerate(single)),
    "logprobs_equal": torch.equal(torch.cat([s.logprobs for s in single]), batch.logprobs)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("bi", [0, 1])
def test_engine_batch_invariance(installer: Installer, bi: int) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": installer.pythonpath(), "DEMO_BATCH_INVARIANT": str(bi)}
    out = subprocess.run([sys.executable, "-c", ENGINE_CHECK], env=env, capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["bi"] is bool(bi) and res["native"]
    if bi:
        assert res["logprobs_equal"] and res["tokens_equal"]
    else:  # the control: batched kernels are not batch-invariant
        assert not res["logprobs_equal"]


# ---- tinyrl.main_ppo on the good PR heads ------------------------------------------------------

@pytest.mark.slow
def test_control_batch_invariance_off_shows_mismatch(installer: Installer, tmp_path: Path) -> None:
    steps, _ = run_ppo(installer, tmp_path, bi=0, lr=1e-3)
    for m in steps:
        assert set(REQUIRED) <= set(m)
        assert m["rollout/batch_invariant"] == 0
        assert m[DIFF_MAX] > 0 and m[DIFF_MEAN] > 0


@pytest.mark.slow
def test_aligned_exact_zero_and_real_update(installer: Installer, tmp_path: Path) -> None:
    steps, elapsed = run_ppo(installer, tmp_path, bi=1, lr=1e-3)
    print(f"2-step aligned run: {elapsed:.1f} s")
    for m in steps:
        assert set(REQUIRED) <= set(m)
        assert m["rollout/batch_invariant"] == 1
        assert m[DIFF_MAX] == 0.0 and m[DIFF_MEAN] == 0.0 and m[K3] == 0.0
        assert m[W_BEFORE] != m[W_AFTER] and len(m[W_AFTER]) == 16
        assert m["actor/lr"] == 1e-3 and m["perf/rollout_tokens_per_s"] > 0
    assert steps[1][W_BEFORE] == steps[0][W_AFTER]


@pytest.mark.slow
def test_zero_update_at_lr_zero(installer: Installer, tmp_path: Path) -> None:
    steps, _ = run_ppo(installer, tmp_path, bi=1, lr=0.0)
    for m in steps:
        assert m[DIFF_MAX] == 0.0 and m[K3] == 0.0
        assert m[W_BEFORE] == m[W_AFTER] == steps[0][W_BEFORE]


@pytest.mark.slow
def test_unknown_override_exits_2(installer: Installer, tmp_path: Path) -> None:
    proc, _ = run_ppo(installer, tmp_path, bi=0, lr=1e-3, extra=["trainer.no_such_key=1"], expect_rc=2)
    assert "unknown key" in proc.stderr


# ---- planted defects --------------------------------------------------------------------------

@pytest.mark.slow
def test_defect_12_batch_invariance_broken(installer: Installer, tmp_path: Path) -> None:
    steps, _ = run_ppo(installer, tmp_path, bi=1, lr=1e-3, prs={"tinyengine": 12})
    assert all(m["rollout/batch_invariant"] == 1 for m in steps)  # claims invariance ...
    assert all(m[DIFF_MAX] > 0 for m in steps)  # ... but is not


@pytest.mark.slow
def test_defect_13_skips_weight_reload(installer: Installer, tmp_path: Path) -> None:
    steps, _ = run_ppo(installer, tmp_path, bi=1, lr=1e-3, prs={"tinyengine": 13})
    assert steps[0][DIFF_MAX] == 0.0 and steps[0][K3] == 0.0  # zero-update check still passes
    assert steps[1][DIFF_MAX] > 0 and steps[1][K3] > 0  # the update never reached the engine


@pytest.mark.slow
def test_defect_23_weight_decay_at_lr_zero(installer: Installer, tmp_path: Path) -> None:
    steps, _ = run_ppo(installer, tmp_path, bi=0, lr=0.0, prs={"tinycore": 23})
    assert all(m[W_BEFORE] != m[W_AFTER] for m in steps)


@pytest.mark.slow
def test_defect_34_nan_metric(installer: Installer, tmp_path: Path) -> None:
    steps, _ = run_ppo(installer, tmp_path, bi=0, lr=1e-3, prs={"tinyrl": 34})
    assert all(math.isnan(m[DIFF_MAX]) for m in steps)
    assert all(math.isfinite(m[DIFF_MEAN]) for m in steps)


@pytest.mark.slow
def test_defect_35_missing_metric(installer: Installer, tmp_path: Path) -> None:
    steps, _ = run_ppo(installer, tmp_path, bi=0, lr=1e-3, prs={"tinyrl": 35})
    assert all(K3 not in m and DIFF_MAX in m for m in steps)


@pytest.mark.slow
def test_defect_14_slow_path_is_still_exact(installer: Installer, tmp_path: Path) -> None:
    """No KV cache: every decode step recomputes the prefix. The correctness gates cannot see it (exact 0)."""
    steps, _ = run_ppo(installer, tmp_path, bi=1, lr=1e-3, prs={"tinyengine": 14})
    assert all(m[DIFF_MAX] == 0.0 and m[K3] == 0.0 and m["perf/rollout_tokens_per_s"] > 0 for m in steps)


@pytest.mark.slow
def test_defect_36_nan_reward_crash_names_its_cause(installer: Installer, tmp_path: Path) -> None:
    """The suite's own recipe runner and decision on the NaN-reward PR: the reason names the first
    non-finite metrics (step 1, the reward among them) and the recipe's last error line."""
    from acceptance import decide, recipe
    from acceptance.defaults import METRICS

    settings = {"entry": [sys.executable, "-m", "tinyrl.main_ppo"], "steps": 2,
                "steps_key": "trainer.total_training_steps", "lr_key": "actor_rollout_ref.actor.optim.lr",
                "lr": 1e-3, "overrides": {"seed": 1}, "env": {"PYTHONPATH": installer.pythonpath(tinyrl=36)},
                "aligned_env": {"DEMO_BATCH_INVARIANT": "1"}, "control_env": {"DEMO_BATCH_INVARIANT": "0"},
                "work_dir": str(tmp_path / "acceptance")}
    run, facts, _ = recipe.run(settings, "rl_step")
    status, reason, _ = decide.rl_step(run, 2, {**METRICS, "reward": "critic/rewards/mean"})
    assert status == "fail" and run.exit_code == 1, reason
    assert reason.startswith("recipe exited with status 1; first non-finite metrics at step 1: "), reason
    assert "critic/rewards/mean = nan" in reason
    assert reason.endswith("last error: RuntimeError: probability tensor contains either `inf`, `nan` or element < 0")


# ---- checkpoints: verl's options, read back with the acceptance suite's hashing ------------------

CKPT = ["trainer.save_freq=1", "trainer.default_local_dir=ckpt", "actor_rollout_ref.actor.weight_checksums=false"]


def _init_model(installer: Installer, tmp_path: Path, prs: dict[str, int] | None = None) -> Path:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": installer.pythonpath(**(prs or {}))}
    subprocess.run([sys.executable, "-m", "tinyrl.init_model", str(tmp_path / "model"), "1"], env=env, check=True)
    return tmp_path / "model"


@pytest.mark.slow
def test_checkpoints_in_verl_layout_without_checksum_metrics(installer: Installer, tmp_path: Path) -> None:
    from acceptance import weights

    model = _init_model(installer, tmp_path)
    steps, _ = run_ppo(installer, tmp_path, bi=1, lr=1e-3, extra=[
        *CKPT, f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"])
    assert all(W_BEFORE not in m and W_AFTER not in m for m in steps)
    actor = tmp_path / "ckpt" / "global_step_2" / "actor"
    assert sorted(p.name for p in actor.iterdir()) == [
        "extra_state_world_size_1_rank_0.pt", "huggingface", "model_world_size_1_rank_0.pt",
        "optim_world_size_1_rank_0.pt"]
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "2"
    shots = [weights.snapshot(str(d)) for d in (model, tmp_path / "ckpt/global_step_1/actor/huggingface",
                                                 tmp_path / "ckpt/global_step_2/actor/huggingface")]
    assert len(shots[0]["tensors"]) == 20 and set(shots[0]["tensors"]) == set(shots[2]["tensors"])
    assert all(weights.compare(a, b)["unchanged"] == [] for a, b in zip(shots, shots[1:]))


@pytest.mark.slow
def test_defect_24_skips_one_tensor_in_the_optimizer_step(installer: Installer, tmp_path: Path) -> None:
    from acceptance import weights

    run_ppo(installer, tmp_path, bi=1, lr=1e-3, prs={"tinycore": 24},
            extra=[*CKPT, "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]"])
    one, two = (weights.snapshot(str(tmp_path / f"ckpt/global_step_{s}/actor/huggingface")) for s in (1, 2))
    assert weights.compare(one, two)["unchanged"] == ["lm_head.weight"]


@pytest.mark.slow
def test_defect_23_moves_weights_at_lr_zero_in_the_checkpoints(installer: Installer, tmp_path: Path) -> None:
    from acceptance import weights

    model = _init_model(installer, tmp_path)
    run_ppo(installer, tmp_path, bi=1, lr=0.0, prs={"tinycore": 23},
            extra=[*CKPT, f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]"])
    one = weights.snapshot(str(tmp_path / "ckpt/global_step_1/actor/huggingface"))
    assert weights.compare(weights.snapshot(str(model)), one)["changed"]
