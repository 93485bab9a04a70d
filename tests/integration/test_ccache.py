"""The compiler cache (builder/image/ccache.py): seeds, the compiler routing in install.py, and on the
real engine the same image digest with a cold cache, a warm cache and no cache, none of it in the image."""
import dataclasses
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pygit2
import pytest
import yaml

from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.engine import client as engine
from builder.image import ccache
from tests.conftest import SETTINGS
from tests.fixture_types import DockerClient

sys.path.insert(0, str(Path(ccache.__file__).parent / "scripts"))
import install  # noqa: E402  (the in-image script)


def names(tar_path: Path) -> list[str]:
    with tarfile.open(tar_path) as tar:
        return tar.getnames()


def test_a_tree_built_before_gets_the_same_seed_a_new_tree_the_newest_harvest(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    first = ccache._component_seed(store, "vllm", "tree-a")
    assert names(first) == ["ccache/vllm"]  # cold: an empty directory
    (store / "live" / "a").mkdir(parents=True)
    (store / "live" / "a" / "obj").write_bytes(b"object")
    same = ccache._component_seed(store, "vllm", "tree-a").read_bytes()
    assert same == first.read_bytes()  # the harvest does not change a built tree's seed (its step stays cached)
    new = ccache._component_seed(store, "vllm", "tree-b")
    assert names(new) == ["ccache/vllm", "ccache/vllm/a", "ccache/vllm/a/obj"]
    assert json.loads((store / "seed.json").read_text())["tree"] == "tree-b"


def test_harvest_extracts_only_files_and_directories_inside_the_store(tmp_path: Path) -> None:
    src = tmp_path / "archive.tar"
    with tarfile.open(src, "w") as tar:
        for name, data in (("vllm/ok/x", b"1"), ("vllm/../../escape", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
        link = tarfile.TarInfo("vllm/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    live = tmp_path / "live"
    live.mkdir()
    ccache._extract([src.read_bytes()], live)
    assert sorted(p.relative_to(live).as_posix() for p in live.rglob("*")) == ["ok", "ok/x"]
    assert not (tmp_path / "escape").exists()


def test_builder_ccache_setting_is_on_or_off() -> None:
    assert Settings.from_env({}).compiler_cache is True
    assert Settings.from_env({"BUILDER_CCACHE": "off"}).compiler_cache is False
    with pytest.raises(BadInput, match="BUILDER_CCACHE: expected on or off"):
        Settings.from_env({"BUILDER_CCACHE": "maybe"})


def test_install_routes_compilers_through_ccache_only_when_seeded(tmp_path: Path) -> None:
    fake = tmp_path / "ccache"
    env = {"PATH": "/usr/bin", "CCACHE_DIR": str(tmp_path / "dir")}
    assert install.compiler_cache(dict(env), ccache=str(fake), masquerade=str(tmp_path / "m")) is False  # no binary
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert install.compiler_cache({"PATH": "/usr/bin"}, ccache=str(fake), masquerade=str(tmp_path / "m")) is False
    assert install.compiler_cache(env, ccache=str(fake), masquerade=str(tmp_path / "m")) is True
    assert env["PATH"].split(os.pathsep)[0] == str(tmp_path / "m")
    for name in ("cc", "gcc", "g++", "c++"):
        assert os.readlink(tmp_path / "m" / name) == str(fake)


# ---- on the real engine


def touched_pins(demo_pins: Path, out: Path, mark: bytes = b"touched by tests/integration/test_ccache.py", pr: int = 91) -> Path:
    """The demo pins with tinyengine at a commit that touches its C source (a new tree of the native
    component, so its install step compiles)."""
    from demo.prepare import variant_pins

    pins_path = variant_pins(out, pins_path=demo_pins)
    data = yaml.safe_load(pins_path.read_text())
    mark += f" in run {SETTINGS.run_id}".encode()  # a tree no earlier run built: the step compiles, not a cache hit
    commit_file(out, data["components"]["vllm"], "csrc/_C.c", lambda old: old + b"/* " + mark + b" */\n", pr)
    pins_path.write_text(yaml.safe_dump(data, sort_keys=False))
    return pins_path


def commit_file(out: Path, comp: dict[str, Any], path: str, change: Callable[[bytes], bytes], pr: int) -> None:
    """A commit on the component's pinned one that changes one file (`change(old bytes)`); the pins follow."""
    repo = pygit2.Repository(str(out / comp["url"]))
    parent = repo.get(comp["commit"])
    *dirs, name = path.split("/")
    trees = [parent.tree]
    for part in dirs:
        trees.append(trees[-1] / part)
    old = repo[(trees[-1] / name).id].data if name in trees[-1] else b""
    entry = repo.create_blob(change(old))
    mode = pygit2.GIT_FILEMODE_BLOB
    for tree, child in zip(reversed(trees), reversed([*dirs, name]), strict=True):
        builder = repo.TreeBuilder(repo[tree.id])
        builder.insert(child, entry, mode)
        entry, mode = builder.write(), pygit2.GIT_FILEMODE_TREE
    sig = pygit2.Signature("demo", "demo@example.invalid", 1735916400, 0)
    commit = repo.create_commit(None, sig, sig, f"{path}: change", entry, [parent.id])
    repo.references.create(f"refs/pull/{pr}/head", commit, force=True)
    comp["commit"], comp["pr"] = str(commit), pr


@pytest.mark.docker
@pytest.mark.slow
def test_same_digest_with_a_cold_a_warm_and_no_compiler_cache(demo_pins: Path, docker_client: DockerClient,
                                                              tmp_path: Path) -> None:
    """Over 60 s under load (99 s in the last CI run, about 35 s idle): three builds of the touched native component
    and every layer after it (a cold compiler cache, the warm one, none); the claim is that the three agree."""
    from builder.image import build, render
    from builder.lock import record as lock_record
    from builder.pins import model as pins_mod
    from builder.sources import resolve as sources

    pins = pins_mod.load(touched_pins(demo_pins, tmp_path))
    rendered = render.render(pins, lock_record.of(pins), sources.resolve(pins, SETTINGS), SETTINGS)
    store = ccache.store(SETTINGS, "vllm", pins.base.digest, ccache.machine_of(docker_client))
    shutil.rmtree(store)  # a cold cache for the native component
    out_dir = Path(rendered.context_path).parent
    runs: dict[str, tuple[str, Any]] = {}  # (manifest digest, ccache counters or None)
    try:
        on = dataclasses.replace(SETTINGS, compiler_cache=True)  # the session builds without it (conftest)
        for name, settings in (("cold", on), ("warm", on), ("none", dataclasses.replace(SETTINGS, compiler_cache=False))):
            if name == "warm":
                (store / "seed.json").unlink()  # the same tree again, now seeded with the harvest
            (out_dir / "ccache.json").unlink(missing_ok=True)
            built = build.build(rendered, settings, echo=False)
            counters: dict[str, Any] = json.loads((out_dir / "ccache.json").read_text()) \
                if (out_dir / "ccache.json").exists() else {}
            runs[name] = (built.manifest_digest, counters.get("vllm"))
        assert runs["cold"][1]["misses"] >= 1 and runs["cold"][1]["hits"] == 0, runs
        assert runs["warm"][1]["hits"] == runs["cold"][1]["misses"] and runs["warm"][1]["misses"] == 0, runs
        assert runs["none"][1] is None, runs  # no ccache ran
        assert runs["cold"][0] == runs["warm"][0] == runs["none"][0], runs
        assert engine.read_file(docker_client, built.image_id, "/builder") is None  # nothing of the build stage
    finally:
        engine.untag(docker_client, rendered.tag)


def test_prune_keeps_the_newest_seed_images_and_the_one_in_use() -> None:
    removed: list[str] = []

    class Api:
        def images(self, name: str) -> list[dict[str, object]]:
            return [{"Id": f"sha256:{t}", "Created": t, "RepoTags": [f"{ccache.REPOSITORY}:{t}"]} for t in range(10)]

        def remove_image(self, ref: str, noprune: bool = False, force: bool = False) -> None:
            removed.append(ref)

    class Client:
        api = Api()

    ccache.prune(Client(), keep=f"{ccache.REPOSITORY}:0", newest=3)
    assert sorted(removed) == [f"{ccache.REPOSITORY}:{t}" for t in range(1, 7)]  # 9, 8, 7 newest; 0 in use


@pytest.mark.docker
@pytest.mark.slow
def test_a_failed_build_keeps_the_compiler_cache_of_a_component_that_compiled(demo_pins: Path, docker_client: DockerClient,
                                                                              tmp_path: Path) -> None:
    """tinyengine compiles (a new tree), then tinycore's install fails (a planted setup.py): the failed
    build still harvests tinyengine's compiler cache, so the fixed build does not compile from nothing."""
    from builder.core.errors import BuildFailed
    from builder.image import build, render
    from builder.lock import record  # lazy: test helper
    from builder.pins import model as pins_mod
    from builder.sources import resolve as sources

    pins_path = touched_pins(demo_pins, tmp_path, mark=b"a failed build keeps this cache", pr=93)
    data = yaml.safe_load(pins_path.read_text())
    commit_file(tmp_path, data["components"]["megatron"], "setup.py",
                lambda old: b"raise SystemExit('planted: tinycore cannot be built')\n", 94)
    pins_path.write_text(yaml.safe_dump(data, sort_keys=False))
    pins = pins_mod.load(pins_path)
    rendered = render.render(pins, record.of(pins), sources.resolve(pins, SETTINGS), SETTINGS)
    store = ccache.store(SETTINGS, "vllm", pins.base.digest, ccache.machine_of(docker_client))
    shutil.rmtree(store)  # a cold cache for the native component
    with pytest.raises(BuildFailed, match="failed at step"):
        build.build(rendered, dataclasses.replace(SETTINGS, compiler_cache=True), echo=False)
    kept = [p for p in (store / "live").rglob("*") if p.is_file()] if (store / "live").is_dir() else []
    assert any(p.suffix in (".o", ".ccache") or "stats" in p.name for p in kept), sorted(p.name for p in kept)[:10]
