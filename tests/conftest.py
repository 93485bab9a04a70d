"""Shared fixtures.

Tests that need a Docker engine are marked `@pytest.mark.docker`: without an engine they skip with
the reason, except when `CI` is set, where they fail (CI must run them). Slow tests and the time
budgets: tests/budget.py.
"""
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from builder.core.options import Settings
from builder.core.records import BuiltImage, GateStatus
from builder.engine.infra import Info
from tests.budget import (  # noqa: F401  (hooks: slow marks, xdist groups, budgets, the timing table)
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_runtest_call,
    pytest_runtest_logreport,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
from tests.engines import Engine
from tests.shared import once

if TYPE_CHECKING:
    from demo.cluster import Cluster
from tests.fixture_types import BuildVariant, DemoAccepted, DemoImage, DockerClient, MakeReportInputs, ReportInputs

# The tests build many variants of the demo on one engine. A build seeded with another compiler-cache state
# (builder/image/ccache.py) than the last one re-runs the steps after the seed copy, so tests that count cache
# hits would depend on their order: the session builds without the compiler cache, and test_ccache turns it on.
os.environ.setdefault("BUILDER_CCACHE", "off")
SETTINGS = Settings.from_env()
FLEET_REPEATS = 4  # the Slurm fleet's most performance pairs (slurm_fleet): it stops once decided


@pytest.fixture(scope="session")
def settings() -> Settings:
    """The environment settings, read once for the session (as the CLI does per command)."""
    return SETTINGS


def _docker_unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so Docker tests must run, but {reason}", pytrace=False)
    pytest.skip(f"needs a Docker engine: {reason}")


@pytest.fixture(scope="session")
def docker_client() -> DockerClient:
    """A docker SDK client that answered ping (skip/fail as above otherwise)."""
    from builder.core.errors import InfraError
    from builder.engine import client as engine

    try:
        return engine.connect(SETTINGS)
    except InfraError as exc:
        _docker_unavailable(str(exc))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator["Cluster"]:
    """The two-node Slurm cluster on this host (n1, n2) (demo/cluster.py) for the whole session, reached through
    SLURM_CONF; stopped at the end of the session, also on failure."""
    import shutil

    from demo import cluster

    missing = [t for t in ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "ch-run") if not shutil.which(t)]
    if missing or os.geteuid() != 0:
        reason = f"a local Slurm cluster needs root and {', '.join(missing) or 'the packages'}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so cluster tests must run, but {reason}", pytrace=False)
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("cluster")
    try:
        found = cluster.start(root)
        os.environ["SLURM_CONF"] = str(found.conf)
        yield found
    finally:
        cluster.stop(root)
        os.environ.pop("SLURM_CONF", None)


@pytest.fixture(scope="session")
def cluster_images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Path]]:
    """(settings, shared directory) of the cluster tests: the session's candidate .sqsh files, exported with the
    shipped squash options (fast LZO: about 4 s for the 1 GB demo image), in one directory removed at the end."""
    import shutil

    where = tmp_path_factory.mktemp("cluster-images")
    yield SETTINGS, where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_fleet(slurm_cluster: "Cluster", demo_pins: Path, cluster_images: tuple[Settings, Path],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`builder nightly A B C D --slurm`, run once for the session; the cluster tests read its reports. Each pins
    file has a name and repository of its own (no earlier run to compare with).
    A: the demo pins, every exact gate (not performance), the recipe across both nodes (the rollout engine on n2):
    the good demo through the whole cluster flow (build, staged digest, the session's one good .sqsh, Slurm gates,
    report); its run is the one test_cluster_publish publishes. The fleet runs beside the whole suite on 2 cores,
    where a benign change's performance may end inconclusive (never fail, docs/gates.md): A's verdict must not hang
    on the machine's load. `make demo-cluster` passes the performance gate on the cluster.
    B: the slow PR (demo vllm PR 14), the performance gate alone, for at most FLEET_REPEATS pairs: under the suite's
    load it fails or ends inconclusive, never passes.
    C, D: the zero_update and rl_step defects (tests/defects.py), each requiring (so running) only the gate its
    defect fails. The four run at once; the cluster runs two allocations at a time (one core each).
    Returns {"proc", "run_id", "names", "pins": {key: path}, "runs": {key: run directory}}."""
    import json
    import subprocess
    import sys
    import uuid
    from pathlib import Path

    from demo.prepare import variant_pins
    from tests.defects import BATCH_INVARIANCE_OFF, REASONS, SKIPPED_WEIGHT_RELOAD, SLOW_EXACT_PATH

    _, shared = cluster_images
    where = tmp_path_factory.mktemp("fleet")
    tag = uuid.uuid4().hex[:8]
    names = {"a": f"fleet-good-{tag}", "b": f"fleet-slow-{tag}", "c": f"fleet-zero-{tag}", "d": f"fleet-rl-{tag}"}

    def pins_for(key: str, defect: tuple[str, int] | None = None, performance: bool = False) -> Path:
        def edit(data: dict[str, Any]) -> None:
            data["name"] = names[key]
            data["image"] = {"repository": f"127.0.0.1:5000/fleet-{tag}/{names[key].split('-')[1]}", "tags": ["demo"]}
            data["nightly"] = {"regression_threshold": 0.0, "retention": 2}
            if key == "a":  # the good demo across the two nodes: the rollout engine on n2, the trainer on n1
                data["acceptance"]["nodes"] = 2
                data["acceptance"]["required_gates"] = [g for g in data["acceptance"]["required_gates"]
                                                        if g != "performance"]
            if defect is not None:  # B, C, D: the defect's own gate only (A and the Docker tests show the others pass)
                data["acceptance"]["required_gates"] = [REASONS[defect][0]]
            if performance:  # two allocations share the 2 cores: CPU time per token spreads up to 2.7 (not 1.7)
                data["acceptance"]["performance"]["max_spread"] = 5.0
                # the sequential rule stops after 2 pairs when they decide; the loaded cluster may need more
                data["acceptance"]["performance"]["repeats"] = FLEET_REPEATS
            else:  # C, D: no performance section (naming it would make it required)
                data["acceptance"].pop("performance", None)
        component, pr = defect or (None, None)
        return variant_pins(where / key, component, pr, edit=edit, pins_path=demo_pins, lock=defect is not None,
                            share_cache=True)  # the demo's layers: each variant builds only from its change

    pins = {"a": pins_for("a"), "b": pins_for("b", SLOW_EXACT_PATH, performance=True),
            "c": pins_for("c", BATCH_INVARIANCE_OFF), "d": pins_for("d", SKIPPED_WEIGHT_RELOAD)}
    run_id = f"fleet{tag}"
    env = dict(os.environ, BUILDER_RUN_ID=run_id, BUILDER_SLURM_SHARED_DIR=str(shared))  # the site's, read once
    proc = subprocess.run([sys.executable, "-m", "builder", "nightly", *[str(pins[k]) for k in "abcd"], "--slurm",
                           "--out", str(where / "out")],
                          cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
                          timeout=1800)
    runs = {k: where / "out" / f"{i}-{pins[k].stem}" for i, k in enumerate("abcd", 1)}
    for k in "bcd":  # only A's .sqsh is read after the run (test_cluster_publish); the others' gigabytes go now
        report = runs[k] / "report.json"
        sqsh = json.loads(report.read_text())["acceptance"]["where"].get("sqsh") if report.is_file() else None
        if sqsh and Path(sqsh["path"]).parent == shared:
            for suffix in ("", ".json", ".sha256"):
                Path(sqsh["path"] + suffix).unlink(missing_ok=True)
    yield {"proc": proc, "run_id": run_id, "names": names, "pins": pins, "runs": runs}
    from builder.engine import client as engine  # the runs' local tags (builder-run/<run ID>-n<i>) go

    client = engine.connect(SETTINGS)
    for i in range(1, 5):
        for image in engine.local_images(client, f"builder-run/{run_id}-n{i}"):
            for tag in image.tags:
                engine.untag(client, tag)


@pytest.fixture(autouse=True)
def _docker_marker(request: pytest.FixtureRequest) -> None:
    """Tests marked `docker` get the engine check (and its skip/fail) without asking for it."""
    if request.node.get_closest_marker("docker"):
        request.getfixturevalue("docker_client")


@pytest.fixture(scope="session")
def infra_setup(docker_client: DockerClient) -> Info:
    """Engine + registry running (idempotent `builder setup`); the dict of what was found/started."""
    from builder.engine import infra

    return infra.ensure_all(SETTINGS)


@pytest.fixture(scope="session")
def base_image(infra_setup: Info, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`127.0.0.1:5000/demo/base@sha256:...`, built once per recipe (cached across sessions)."""
    from demo import baseimage

    return once(tmp_path_factory, "base_image", lambda: baseimage.ensure_base_image(SETTINGS))


# ---- report / publish: records without git or Docker, and registries of our own


@pytest.fixture(scope="session")
def report_inputs(tmp_path_factory: pytest.TempPathFactory) -> MakeReportInputs:
    """Factory: (pins, sources, build, acceptance) records shaped like real ones, from pins/demo.yaml
    with fixed commits.  `statuses` overrides gate statuses; a gate set to None is left out."""
    import copy
    import hashlib
    from pathlib import Path

    import yaml

    from builder.core.records import (
        AcceptanceResult,
        BuiltImage,
        DockerFacts,
        Evidence,
        GateResult,
        ResolvedComponent,
        ResolvedSources,
    )
    from builder.pins import model as pins_mod

    pins_dir = Path(__file__).resolve().parent.parent / "pins"
    data = yaml.safe_load((pins_dir / "demo.yaml").read_text())

    def sha1(text: str) -> str:
        return hashlib.sha1(text.encode()).hexdigest()

    site = "/opt/venv/lib/python3.11/site-packages"
    steps = {"1": {"diff_max": 0.0, "k3_kl": 0.0, "reward": 0.5, "loss": -0.1,
                   "weights_before": "0f1e2d3c4b5a6978", "weights_after": "8877665544332211"},
             "2": {"diff_max": 0.0, "k3_kl": 0.0, "reward": 0.6, "loss": -0.2,
                   "weights_before": "8877665544332211", "weights_after": "1122334455667788"}}
    evidence: dict[str, dict[str, Any]] = {  # shapes as acceptance/provenance.py and acceptance/decide.py write them
        "provenance": {"manifest": {"path": "/opt/delivery/manifest.json", "sha256": "56" * 32, "site_packages": site},
                       "interpreter": {"executable": "/opt/venv/bin/python", "version": "3.11.9"},
                       "components": {"vllm": {"version": "0.2.0", "stamp": {"commit": sha1("vllm")},
                                               "modules": {"tinyengine": {"file": f"{site}/tinyengine/__init__.py"}},
                                               "files": {"manifest": 9}}},
                       "native_libs_loaded": {}, "caches_at_start": {"/cache/triton": []}, "failures": []},
        "zero_update": {"exit_code": 0, "steps": {"1": {"diff_max": 0.0, "k3_kl": 0.0}, "2": {"diff_max": 0.0, "k3_kl": 0.0}},
                        "weights": ["0f1e2d3c4b5a6978"]},
        "rl_step": {"exit_code": 0, "steps": steps, "throughput": 1234.5},
        "control": {"exit_code": 0, "diff_max": 0.0123, "throughput": 1200.0},
        "performance": {"metric": "perf/rollout_tokens_per_s", "min_ratio": 0.25, "max_spread": 3.0, "ratio": 1.02875,
                        "aligned": {"runs": [1234.5] * 3, "median": 1234.5, "spread": 1.0},
                        "control": {"runs": [1200.0] * 3, "median": 1200.0, "spread": 1.0}, "repeats": 3,
                        "runs": [{"run": i, "arm": arm, "status": "pass", "throughput": value}
                                 for i in (1, 2, 3) for arm, value in (("aligned", 1234.5), ("control", 1200.0))]},
    }

    def make(repository: str = "127.0.0.1:5000/demo/unified", image_id: str = "sha256:" + "ab" * 32,
             statuses: dict[str, GateStatus | None] | None = None, acceptance: bool = True, build: bool = True,
             accepted_image: str | None = None, required: list[str] | None = None, tags: tuple[str, ...] = ("demo",),
             platform: str | None = None) -> ReportInputs:
        d = copy.deepcopy(data)
        if platform:
            d["base"]["platform"] = platform
        d["image"] = {"repository": repository, "tags": list(tags)}
        d["base"]["image"] = "127.0.0.1:5000/demo/base@sha256:" + "cd" * 32
        for name in ("vllm", "megatron", "verl"):
            d["components"][name]["commit"] = sha1(name)
        if required is not None:
            d["acceptance"]["required_gates"] = list(required)
        # a real pins file next to a copy of the lock, so publish can re-read it and check its sha256
        where = tmp_path_factory.mktemp("report-pins")
        (where / "locks").mkdir()
        (where / "locks" / "demo.lock").write_bytes((pins_dir / "locks" / "demo.lock").read_bytes())
        (where / "demo.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
        pins = pins_mod.load(where / "demo.yaml")
        comps = {name: ResolvedComponent(
            name=name, url=str(pins_dir / comp.url), target=comp.target, pr=comp.pr, commit=comp.commit,
            tree=sha1("tree" + name), commit_time=946684800, pr_head=comp.commit, pr_moved=False,
            merge_base=sha1("base" + name), ahead=2, behind=1, target_head=sha1("main" + name),
            export_sha256=hashlib.sha256(name.encode()).hexdigest(), files=7) for name, comp in pins.components.items()}
        sources = ResolvedSources(pins_path=str(pins.path), pins_sha256=pins.sha256,
                                  resolved_at="2026-11-01T00:00:00Z", components=comps)
        built = BuiltImage(image_id=image_id, tags=[f"{repository}:x"], size=123456789, created="2026-11-01T00:00:00Z",
                           engine_version="20.10.24", builder_version="0.1.0", context_sha256="12" * 32,
                           dockerfile_sha256="34" * 32, stage_times={"sources": 1.5, "install": 20.25},
                           log_path="/tmp/build.log", cached=False) if build else None
        status: dict[str, GateStatus | None] = {g: "pass" for g in evidence}
        status.update(statuses or {})
        gates = [GateResult(name=g, status=s, reason=f"{g} {s}", evidence=Evidence.model_validate(evidence[g]), log="tail")
                 for g, s in status.items() if s is not None]
        result = AcceptanceResult(image_id=accepted_image or image_id, gates=gates,
                                  where=DockerFacts(run_id="c0ffee", network="none",
                                                    env={"TRITON_CACHE_DIR": "/cache/triton"},
                                                    tmpfs={"/cache": "rw,exec"}),
                                  environment={"engine": "20.10.24"},
                                  throughput={"metric": "perf/rollout_tokens_per_s", "aligned": 1234.5, "control": 1200.0,
                                              "ratio": 1.02875}) if acceptance else None
        return pins, sources, built, result

    return make


# ---- render / build: the demo image, built once per session


@pytest.fixture(scope="session")
def demo_pins(docker_client: DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pins/demo.local.yaml ready to build: engine, registry, base image, demo stack (demo.prepare)."""
    from demo.prepare import prepare_demo

    return once(tmp_path_factory, "demo_pins", lambda: prepare_demo(SETTINGS))


def _resolve_render_build(pins_path: Path) -> DemoImage:
    from builder.image import build, render
    from builder.lock import record as lock_record
    from builder.pins import model as pins_mod
    from builder.sources import resolve as sources

    pins = pins_mod.load(pins_path)
    resolved = sources.resolve(pins, SETTINGS)
    rendered = render.render(pins, lock_record.of(pins), resolved, SETTINGS)
    return pins, resolved, rendered, build.build(rendered, SETTINGS, echo=False)


@pytest.fixture(scope="session")
def demo_image(demo_pins: Path, tmp_path_factory: pytest.TempPathFactory) -> DemoImage:
    """(pins, sources, rendered, built) of pins/demo.yaml, built once per session."""
    return once(tmp_path_factory, "demo_image", lambda: _resolve_render_build(demo_pins))


@pytest.fixture(scope="session")
def build_variant(demo_pins: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuildVariant]:
    """Factory: build(component, pr) -> BuiltImage of the demo stack with that component pinned to
    the head of demo PR `pr` (e.g. ('vllm', 13)); one build per key per session."""
    from demo.prepare import variant_pins

    built: dict[tuple[str, int], BuiltImage] = {}

    def build(component: str, pr: int) -> BuiltImage:
        key = (component, int(pr))
        if key not in built:
            out = tmp_path_factory.mktemp(f"variant-{component}-{pr}")
            built[key] = _resolve_render_build(variant_pins(out, component, pr, pins_path=demo_pins))[3]
        return built[key]

    yield build
    # defect variants are never accepted: leave no tag of theirs in the publish namespace
    from builder.engine import client as engine

    client = engine.connect(SETTINGS)
    for image in built.values():
        for tag in image.tags:
            engine.untag(client, tag)


# ---- acceptance of the demo image, once per session (report / publish end to end)


@pytest.fixture(scope="session")
def demo_accepted(demo_image: DemoImage, tmp_path_factory: pytest.TempPathFactory) -> DemoAccepted:
    """(pins, sources, built, AcceptanceResult) of all four gates run on the demo image."""
    from builder.runners import factory as runners

    pins, resolved, _, built = demo_image
    return once(tmp_path_factory, "demo_accepted",
                lambda: (pins, resolved, built, runners.gate_local_image(built.image_id, pins, SETTINGS)))


# ---- a second Docker engine (tests/engines.py), shared by every test that needs one


@pytest.fixture(scope="module")
def second_engine(docker_client: DockerClient) -> Iterator[Engine]:
    """URL of a second dockerd (own data root, exec root, pidfile, socket; no bridge) started for the module
    that asks (its images take gigabytes); stopped, its containers removed and its directories deleted at the
    module's end, also on failure."""
    import shutil

    from tests.engines import second_engine as start

    if shutil.which("dockerd") is None or os.geteuid() != 0:
        _docker_unavailable("a second dockerd needs the dockerd binary and root")
    with start() as engine:
        yield engine


@pytest.fixture(scope="session")
def staged_demo(demo_image: DemoImage, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo image pushed by digest to its staging repository: `<staging>@<manifest digest>`."""
    from builder.engine import staging

    pins, _, _, built = demo_image
    repo = staging.staging_repository(pins.image.repository, pins.image.staging)
    return once(tmp_path_factory, "staged_demo",
                lambda: staging.push(built.manifest_digest, repo, pins.base.name, SETTINGS))


@pytest.fixture(scope="session")
def stamped_pins(demo_pins: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo variant whose verl-role build step stamps the wall-clock time into tinyrl/BUILD_TIME
    (a setup.py on top of the pinned commit, as PR #90): a build input that varies."""
    import pygit2
    import yaml

    from demo.prepare import variant_pins

    out = tmp_path_factory.mktemp("stamped")
    pins_path = variant_pins(out, pins_path=demo_pins)
    data = yaml.safe_load(pins_path.read_text())
    comp = data["components"]["verl"]
    repo = pygit2.Repository(str(out / comp["url"]))
    parent = repo.get(comp["commit"])
    setup = (b"import os, time\nfrom setuptools import setup\nfrom setuptools.command.build_py import build_py\n\n\n"
             b"class Stamp(build_py):\n    def run(self):\n        super().run()\n"
             b"        with open(os.path.join(self.build_lib, 'tinyrl', 'BUILD_TIME'), 'w') as fh:\n"
             b"            fh.write(str(time.time_ns()))\n\n\nsetup(cmdclass={'build_py': Stamp})\n")
    builder = repo.TreeBuilder(parent.tree)
    builder.insert("setup.py", repo.create_blob(setup), pygit2.GIT_FILEMODE_BLOB)
    sig = pygit2.Signature("demo", "demo@example.invalid", 1735912800, 0)
    commit = repo.create_commit(None, sig, sig, "build: stamp the build time", builder.write(), [parent.id])
    repo.references.create("refs/pull/90/head", commit, force=True)
    comp["commit"], comp["pr"] = str(commit), 90
    pins_path.write_text(yaml.safe_dump(data, sort_keys=False))
    return pins_path


@pytest.fixture
def run_id(docker_client: DockerClient) -> Iterator[str]:
    """The label value of one test's acceptance containers; all of them are gone afterwards."""
    import uuid

    from builder.runners import docker_runner

    value = f"test-{uuid.uuid4().hex[:10]}"
    yield value
    left = docker_runner.leftover_containers(docker_client, value)
    for container_id in left:
        docker_client.api.remove_container(container_id, force=True)
    assert left == [], "acceptance containers left behind"
