"""`builder lock`: VCS versions, the offline closure of a generated hatchling package with real PyPI
dependencies (locked, built offline on the demo base, imported in a fresh network-none container),
and each error path: base conflict, sdist-only dependency, stale lock under --check."""
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pygit2
import pytest

from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.lock import lockfile as lock
from builder.lock import wheels
from builder.pipeline import building
from builder.sources import scmversion
from tests.fixture_types import DockerClient

SIG = pygit2.Signature("Test", "test@example.invalid", 1735725600, 0)
PROJECT = Path(__file__).resolve().parents[2]

PYPROJECT = """[build-system]
requires = ["hatchling>=1.20"]
build-backend = "hatchling.build"

[project]
name = "hatchpkg"
version = "1.0.0"
requires-python = ">=3.10"
dependencies = [{deps}]
"""
MODULE = '''"""A package with a non-setuptools backend and real PyPI dependencies."""
import yaml
from packaging.version import Version


def check() -> str:
    return yaml.safe_dump({"version": str(Version("1.0.0")), "ok": True}, sort_keys=True)
'''
# PR number: (dependencies, what it tests)
PRS = {1: ['"packaging>=23"', '"pyyaml>=6"'],
       2: ['"packaging>=23"', '"pyyaml>=6"', '"torch>=99"'],   # the base has torch 2.13.0: conflict
       3: ['"packaging>=23"', '"pyyaml>=6"', '"docopt==0.6.2"'],  # docopt has only an sdist
       4: ['"packaging>=23"', '"pyyaml>=6"', '"six>=1.16"']}  # requirements changed: lock stale


def commit(repo: Any, files: dict[str, str], parents: list[Any], message: str, when: int = 0) -> Any:  # pygit2 (untyped)
    tb = repo.TreeBuilder()
    sub = repo.TreeBuilder()
    for name, text in files.items():
        if name.startswith("hatchpkg/"):
            sub.insert(name.split("/", 1)[1], repo.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB)
        else:
            tb.insert(name, repo.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB)
    tb.insert("hatchpkg", sub.write(), pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature(SIG.name, SIG.email, SIG.time + when, 0)
    return repo.create_commit(None, sig, sig, message, tb.write(), parents)


def make_repo(path: Path) -> dict[int, str]:
    """A real git repo: main plus refs/pull/N/head for each PRS entry; returns {pr: commit}."""
    repo = pygit2.init_repository(str(path), bare=True)
    files = {"pyproject.toml": PYPROJECT.format(deps=", ".join(PRS[1])), "hatchpkg/__init__.py": MODULE}
    root = commit(repo, {**files, "README.md": "hatchpkg\n"}, [], "Initial hatchpkg\n")
    repo.references.create("refs/heads/main", root)
    heads = {}
    for n, deps in PRS.items():
        heads[n] = str(commit(repo, {**files, "pyproject.toml": PYPROJECT.format(deps=", ".join(deps))},
                              [root], f"PR {n}\n", when=n))
        repo.references.create(f"refs/pull/{n}/head", pygit2.Oid(hex=heads[n]))
    return heads


@pytest.fixture(scope="session")
def hatch_pins(demo_pins: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """Factory: pr -> pins path of the demo stack with the verl role replaced by hatchpkg at that PR."""
    from demo.prepare import variant_pins

    root = tmp_path_factory.mktemp("hatch")
    heads = make_repo(root / "hatchpkg.git")

    def make(pr: int) -> Path:
        out = root / f"pr{pr}"
        if not (out / "pins.yaml").exists():
            out.mkdir()
            shutil.copytree(root / "hatchpkg.git", out / "hatchpkg.git")

            def edit(data: dict[str, Any]) -> None:
                data["components"]["verl"].update(url="hatchpkg.git", pr=pr, commit=heads[pr], distribution="hatchpkg",
                                                  modules=["hatchpkg"])
                data["build"]["lock"] = "locks/hatch.lock"

            variant_pins(out, edit=edit, pins_path=demo_pins)
        return out / "pins.yaml"

    return make


@pytest.fixture(scope="session")
def hatch_locked(hatch_pins: Callable[[int], Path], settings: Settings) -> tuple[Path, str, str]:
    """(pins path, lock text of the first run, lock text of the second run) for PR 1."""
    path = hatch_pins(1)
    first = building.lock(path, settings).text
    second = building.lock(path, settings).text
    return path, first, second


# ---------------------------------------------------------------- VCS versions (no Docker)


def tagged_repo(path: Path, tag: str | None, commits: int) -> tuple[Any, list[str]]:
    repo = pygit2.init_repository(str(path), bare=True)
    parents: list[Any] = []
    oids: list[Any] = []
    for k in range(commits):
        files = {"pyproject.toml": '[build-system]\nrequires = ["setuptools", "setuptools-scm>=8"]\n'
                                   '[project]\nname = "x"\ndynamic = ["version"]\n[tool.setuptools_scm]\n',
                 "hatchpkg/__init__.py": f"# {k}\n"}
        oid = commit(repo, files, parents, f"c{k}\n", when=k)
        parents, oids = [oid], oids + [oid]
        if k == 0 and tag:
            repo.create_tag(tag, oid, pygit2.enums.ObjectType.COMMIT, SIG, "release\n")
    return repo, [str(o) for o in oids]


def test_vcs_version_is_nearest_tag_distance_and_commit(tmp_path: Path) -> None:
    repo, oids = tagged_repo(tmp_path / "r.git", "v1.4.0", 3)
    assert scmversion.component_version(repo, oids[0]) == "1.4.0"
    assert scmversion.component_version(repo, oids[2]) == f"1.4.1.dev2+g{oids[2][:7]}"


def test_vcs_version_without_a_tag_counts_commits(tmp_path: Path) -> None:
    repo, oids = tagged_repo(tmp_path / "r.git", None, 2)
    assert scmversion.component_version(repo, oids[1]) == f"0.1.dev2+g{oids[1][:7]}"


def test_static_version_and_env_name() -> None:
    assert scmversion.scm_settings({"build-system": {"requires": ["hatchling"]}, "project": {"version": "1"}}) is None
    assert scmversion.scm_settings({"tool": {"hatch": {"version": {"source": "vcs"}}}}) == {}
    assert scmversion.pretend_env_name("Tiny_Engine.x") == "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_TINY_ENGINE_X"
    with pytest.raises(BadInput, match="expected a PEP 440"):
        scmversion.checked("1.0; rm -rf /")


def test_demo_engine_version_comes_from_its_tag(tmp_path: Path) -> None:
    from demo.make_stack import make_stack

    stack = make_stack(tmp_path)["repos"]["tinyengine"]
    repo = pygit2.Repository(str(tmp_path / "tinyengine.git"))
    head = stack["prs"]["11"]["head"]
    assert "refs/tags/v0.2.0" in stack["refs"]
    assert scmversion.component_version(repo, head) == f"0.2.1.dev3+g{head[:7]}"


def test_split_lock_and_base_conflict_messages() -> None:
    runtime, build = wheels.split_lock("# h\na==1 --hash=sha256:" + "0" * 64 + "  # a.whl\n"
                                     "b==2 --hash=sha256:" + "1" * 64 + "  # build: b.whl\n")
    assert runtime.startswith("a==1") and build.startswith("b==2")
    with pytest.raises(BadInput, match=r"components.verl: requires 'torch>=99' but the base provides torch 2.13.0"):
        lock.check_against(["torch>=99"], {"torch": "2.13.0+cpu"}, "components.verl", "the base")


# ---------------------------------------------------------------- with Docker and PyPI


@pytest.mark.docker
def test_lock_twice_is_byte_identical_and_pins_everything(hatch_locked: tuple[Path, str, str]) -> None:
    _, first, second = hatch_locked
    assert first == second
    entries = {line.split("==")[0]: line for line in first.splitlines() if "--hash=sha256:" in line}
    assert {"pyyaml", "hatchling", "setuptools-scm"} <= set(entries)
    assert "packaging" not in entries and "setuptools" not in entries  # the base provides them, as they are
    assert "# build: " in entries["hatchling"] and "# build: " not in entries["pyyaml"]
    assert "cp311" in entries["pyyaml"] and "torch" not in entries  # base's interpreter; base kept as it is
    assert "tinyengine 0.2.1.dev3+g" in first and "hatchpkg 1.0.0" in first


@pytest.mark.docker
def test_locked_package_builds_offline_and_imports_in_a_fresh_container(hatch_locked: tuple[Path, str, str],
                                                                        docker_client: DockerClient,
                                                                        settings: Settings) -> None:
    from builder.engine import client as engine
    from builder.image import build, render
    from builder.lock import record as lock_record
    from builder.pins import model as pins_mod
    from builder.sources import resolve as sources

    pins = pins_mod.load(hatch_locked[0])
    resolved = sources.resolve(pins, settings)
    rendered = render.render(pins, lock_record.of(pins), resolved, settings)
    assert "/install/buildtools" in rendered.dockerfile and "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_TINYENGINE" in rendered.dockerfile
    built = build.build(rendered, settings, echo=False)
    try:
        out = docker_client.containers.run(built.image_id, ["python", "-c", (
            "import hatchpkg; print(hatchpkg.check()); import importlib.util as u; print(u.find_spec('hatchling'))")],
                                           network_mode="none", remove=True).decode()
        assert "ok: true" in out and "version: 1.0.0" in out
        assert out.strip().endswith("None")  # the build backend stayed in the build stage
        data = engine.read_file(docker_client, built.image_id, "/opt/delivery/manifest.json")
        assert data is not None
        manifest = json.loads(data)
        assert manifest["components"]["vllm"]["version_from_vcs"] is True
        assert manifest["components"]["vllm"]["version"] == resolved.components["vllm"].version
    finally:
        for tag in built.tags:
            engine.untag(docker_client, tag)


@pytest.mark.docker
def test_check_passes_on_a_fresh_lock_and_fails_when_requirements_change(hatch_locked: tuple[Path, str, str],
                                                                         hatch_pins: Callable[[int], Path], settings: Settings,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from builder import cli

    path = hatch_locked[0]
    assert building.lock(path, settings, check=True).inputs_sha256 == lock.recorded_inputs(hatch_locked[1])
    stale = hatch_pins(4)
    shutil.copyfile(path.parent / "locks" / "hatch.lock", stale.parent / "locks" / "hatch.lock")
    code = cli.run(["lock", str(stale), "--check"])
    err = capsys.readouterr().err
    assert code == 1 and "stale" in err, err


@pytest.mark.docker
def test_requirement_the_base_cannot_meet_is_bad_input(hatch_pins: Callable[[int], Path], hatch_locked: tuple[Path, str, str],
                                                       settings: Settings) -> None:
    with pytest.raises(BadInput, match=r"components.verl .*requires 'torch>=99' but the base .* provides torch 2.13.0"):
        building.lock(hatch_pins(2), settings)


@pytest.mark.docker
def test_sdist_only_dependency_is_an_error_unless_built_in_the_base(hatch_pins: Callable[[int], Path],
                                                                    hatch_locked: tuple[Path, str, str],
                                                                    settings: Settings) -> None:
    path = hatch_pins(3)
    with pytest.raises(BadInput, match=r"only an sdist for the base \(docopt==0.6.2\); pass --build-sdists"):
        building.lock(path, settings)
    text = building.lock(path, settings, build_sdists=True).text
    line = next(ln for ln in text.splitlines() if ln.startswith("docopt==0.6.2 "))
    assert "built from sdist sha256 " in line and "py3-none-any.whl" in line


def test_static_project_metadata_needs_no_build_but_dynamic_does() -> None:
    static = {"project": {"name": "a", "version": "1.0", "dependencies": ["pyyaml>=6"]}}
    assert lock.static_metadata(static) == {"name": "a", "version": "1.0", "requires_dist": ["pyyaml>=6"]}
    for dynamic in (["version"], ["dependencies"]):
        assert lock.static_metadata({"project": {**static["project"], "dynamic": dynamic}}) is None
    assert lock.static_metadata({}) is None  # setup.py only: prepared in the base


@pytest.mark.docker
def test_target_is_read_from_the_base_and_checked_against_the_pins(base_image: str, settings: Settings) -> None:
    from builder.engine import basecontainer

    base = basecontainer.read_base(settings, base_image, "/opt/venv/bin/python", "3.11", "linux/amd64")
    assert (base.python, base.abi, base.glibc[0]) == ("3.11", "cp311", 2) and "torch" in base.dists
    with pytest.raises(BadInput, match=r"base.python: pinned '3.12', the base's /opt/venv/bin/python is Python 3.11"):
        basecontainer.read_base(settings, base_image, "/opt/venv/bin/python", "3.12", "linux/amd64")
