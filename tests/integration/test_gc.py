"""`builder gc` (builder/nightly/gc.py) frees what ended runs left and keeps what a live run holds; a failed
base container (the lock's) leaves no container behind (issue 28 items 7 and 8)."""
from __future__ import annotations

import dataclasses
import io
import os
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.core import files as fs
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.engine import basecontainer, infra, normalize
from builder.engine import client as engine
from builder.engine.registry import Registry
from builder.image import ccache, context
from builder.nightly import gc
from tests.shared import derived_images, image_ids

ROOT = Path(__file__).resolve().parents[2]
OLD = time.time() - 30 * 86400


def tiny_image(docker_client: Any, repository: str, tag: str) -> str:
    """An image of one empty file, imported (no pull, no build)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(f"gc-test-{repository.replace('/', '-')}-{tag}")
        tar.addfile(info, io.BytesIO(b""))
    docker_client.api.import_image_from_data(buf.getvalue(), repository=repository, tag=tag)
    return str(docker_client.api.inspect_image(f"{repository}:{tag}")["Id"])


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Any]:
    """Another live process that holds the files it is given (as a live run's builder would)."""
    procs: list[subprocess.Popen[str]] = []

    def hold(*paths: Path) -> None:
        code = ("import sys, time\nfrom pathlib import Path\nfrom builder.core import files as fs\n"
                "[fs.hold(Path(p)) for p in sys.argv[1:]]\nprint('held', flush=True)\ntime.sleep(300)\n")
        proc = subprocess.Popen([sys.executable, "-c", code, *map(str, paths)], cwd=ROOT, stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        procs.append(proc)

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def ended_run(settings: Settings, run_id: str) -> None:
    """A run of this cache that started long ago and ended: its live lock is here, held by nobody."""
    lock = settings.live_lock(run_id)
    lock.touch()
    os.utime(lock, (OLD, OLD))


def aged(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        os.utime(p, (OLD, OLD))


@pytest.mark.docker
def test_gc_frees_what_ended_runs_left_and_keeps_what_a_live_run_holds(tmp_path: Path, settings: Settings,
                                                                       docker_client: Any, holder: Any) -> None:
    cache = dataclasses.replace(settings, cache_root=tmp_path / "cache", run_id="gc-test-self")
    # run IDs dated now: every build sweeps other runs' tags older than a day (build.sweep_run_tags), and builds of
    # other tests run beside this one; the lock file says when the dead run ended (aged)
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime())
    dead, alive = f"{stamp}-gcdead", f"gc-live-{os.getpid()}"
    ended_run(cache, dead)
    # contexts: one whose build ended (no holder), one a live run renders or builds; an old build dir
    for name in ("ended", "held", "old"):
        out = cache.cache("builds", name)
        (out / "context.tar").write_bytes(b"x" * 4096)
        (out / "Dockerfile").write_text("FROM scratch\n")
        (out / "context.sha256").write_text("0" * 64 + "  context.tar\n")
    aged(cache.cache("builds", "old"))
    # logs: the ended run's (old), the live run's (old too, but live)
    for run_id in (dead, alive):
        (cache.cache("logs", run_id) / "lock-metadata-vllm.log").write_text("exit 1\n")
        aged(cache.cache("logs", run_id))
    # run directories of one pins name: 3 old ones, one of them ACCEPTED; keep the newest 1
    for i, verdict in enumerate(("ACCEPTED", "NOT ACCEPTED", "NOT ACCEPTED")):
        run_dir = cache.cache("runs", f"demo-2020010{i + 1}-000000")
        (run_dir / "report.json").write_text(f'{{"verdict": "{verdict}"}}\n')
        aged(run_dir)
        os.utime(run_dir, (OLD + i, OLD + i))
    holder(cache.live_lock(alive), context.hold_path(cache.cache("builds", "held")))
    tags = [f"builder-run/{dead}:gc", f"builder-run/{alive}:gc", f"builder-run/{stamp}-elsewhere:gc"]
    ids = [tiny_image(docker_client, *t.split(":")) for t in tags]
    try:
        freed = gc.gc(cache, older_than_s=86400, keep_runs=1)
        client = engine.connect(cache)
        assert engine.inspect_image(client, tags[0]) is None  # the ended run's tag, and its unused image
        assert engine.inspect_image(client, ids[0]) is None
        assert engine.inspect_image(client, tags[1]) is not None  # the live run's
        assert engine.inspect_image(client, tags[2]) is not None  # a run of another cache on this engine
        assert freed.removed["run tags"] == [tags[0]] and tags[1] in freed.kept_live["run tags"]
    finally:
        for tag in tags:
            engine.untag(engine.connect(cache), tag)
    builds = cache.cache("builds")
    assert not (builds / "ended" / "context.tar").exists()
    assert sorted(p.name for p in (builds / "ended").iterdir()) == [".context.lock", "Dockerfile", "context.sha256"] \
        or sorted(p.name for p in (builds / "ended").iterdir()) == ["Dockerfile", "context.sha256"]
    assert (builds / "held" / "context.tar").exists() and not (builds / "old").exists()
    assert not (cache.cache_root / "logs" / dead).exists() and (cache.cache_root / "logs" / alive).exists()
    assert sorted(p.name for p in cache.cache("runs").iterdir()) == ["demo-20200101-000000", "demo-20200103-000000"]
    assert freed.bytes >= 2 * 4096


def test_a_builds_context_goes_when_its_build_ends_unless_another_run_holds_it(tmp_path: Path, holder: Any) -> None:
    out = tmp_path / "builds" / "abc"
    out.mkdir(parents=True)
    tar = out / "context.tar"
    tar.write_bytes(b"ctx")
    fs.hold(context.hold_path(out))  # this run rendered it
    holder(context.hold_path(out))  # ... and so did another live run
    assert not context.build_ended(tar) and tar.exists()
    assert context.build_ended(tar) is False  # still held by the other
    fs.release(context.hold_path(out))


def test_a_context_no_one_holds_goes_when_the_build_ends(tmp_path: Path) -> None:
    out = tmp_path / "builds" / "abc"
    out.mkdir(parents=True)
    tar = out / "context.tar"
    tar.write_bytes(b"ctx")
    fs.hold(context.hold_path(out))
    assert context.build_ended(tar) and not tar.exists()


@pytest.mark.docker
def test_a_failed_base_container_leaves_nothing_behind(tmp_path: Path, settings: Settings, docker_client: Any) -> None:
    """The lock's planted failure: the base has no such interpreter. One line, exit 2, and no container,
    image, tag or log outside this run's."""
    image = "builder-tests/gc-nopython:1"
    image_id = tiny_image(docker_client, *image.split(":"))
    cache = dataclasses.replace(settings, cache_root=tmp_path / "cache", run_id="gc-test-failed-lock")
    owner = f"{socket.gethostname()}:{os.getpid()}"
    images_before = image_ids(docker_client)
    try:
        with pytest.raises(BadInput) as err:
            basecontainer.read_base(cache, image_id, "/nonexistent/python3", "3.11", "linux/amd64")
        assert err.value.exit_code == 2 and "\n" not in str(err.value)
        assert str(err.value).startswith(f"base.python_bin: /nonexistent/python3 does not run in {image_id} (exit 127):")
        assert 'exec: "/nonexistent/python3": stat /nonexistent/python3: no such file or directory' in str(err.value)
        shown = err.value.logs[0] if err.value.logs else str(err.value)  # the log path: in the line, or below it when too long
        assert shown.endswith("/lock-base-query.log") and cache.run_log("lock-base-query").is_file()
        left = [c.name for c in docker_client.containers.list(all=True, filters={"label": engine.OWNER_LABEL})
                if c.labels.get(engine.OWNER_LABEL) == owner]
        assert left == []
        # other workers make images too: only those on this test's image count
        assert derived_images(docker_client, images_before, image_id) == []
        assert sorted(p.name for p in (cache.cache_root / "logs").iterdir()) == ["gc-test-failed-lock"]
    finally:
        engine.remove_image(engine.connect(cache), image)


# ---------------------------------------------------------------- seeds and raw layers


def seed_image(docker_client: Any, settings: Settings, work: Path, name: str) -> str:
    """A compiler-cache seed image made as ccache.prepare makes one (a harvested store's seed tar, combined and
    imported as builder-ccache/seed:<sha[:16]>), holding a file only this one has; this run's hold on it."""
    live = work / name / "live"
    live.mkdir(parents=True)
    (live / f"{name}-{os.getpid()}-{time.time_ns()}").write_bytes(os.urandom(16))
    part, combined = work / name / "seed.tar", work / name / "combined.tar"
    ccache._write_seed(live, "vllm", part)
    ccache._combine(combined, None, [part])
    tag = f"{ccache.REPOSITORY}:{fs.sha256_file(combined)[:16]}"
    repository, _, short = tag.rpartition(":")
    docker_client.api.import_image_from_file(str(combined), repository=repository, tag=short)
    fs.hold(ccache.hold_path(settings, tag))
    return tag


def raw_manifest(docker_client: Any, settings: Settings, host: str, name: str) -> str:
    """An image's raw-layer manifest pushed as normalisation pushes it (builder-raw/layers:<image ID hex>, held by
    this run while it reads the layers back); the local image is removed, the tag in the registry stays."""
    image_id = tiny_image(docker_client, "builder-tests/gc-raw", f"{name}-{os.getpid()}-{time.time_ns()}")
    normalize.raw_manifest_via_registry(docker_client, image_id, host, settings)
    engine.remove_image(docker_client, image_id)
    return image_id.removeprefix("sha256:")


@pytest.mark.docker
def test_gc_removes_ended_seeds_and_raw_manifests_and_keeps_live_ones_and_others(
        tmp_path: Path, settings: Settings, docker_client: Any, holder: Any) -> None:
    cache = dataclasses.replace(settings, cache_root=tmp_path / "cache", run_id="gc-test-seeds")
    other = dataclasses.replace(settings, cache_root=tmp_path / "other-cache", run_id="gc-test-other")
    host = infra.registry_url()
    reg = Registry.from_settings(host, cache)
    seeds = {name: seed_image(docker_client, cache if name != "other" else other, tmp_path / "seeds", name)
             for name in ("ended", "live", "other")}
    time.sleep(1.1)  # the engine dates images by the second: the newest is newer than all three
    seeds["newest"] = seed_image(docker_client, cache, tmp_path / "seeds", "newest")
    raws = {name: raw_manifest(docker_client, cache if name != "other" else other, host, name)
            for name in ("ended", "live", "other")}
    for name, tag in seeds.items():  # this run's builds ended; another live run builds with the "live" seed
        fs.release(ccache.hold_path(cache if name != "other" else other, tag))
    for name, tag in raws.items():  # this run read its layers back; another live run is reading "live"'s
        fs.release(normalize.raw_hold_path(cache if name != "other" else other, tag))
    holder(ccache.hold_path(cache, seeds["live"]), normalize.raw_hold_path(cache, raws["live"]))
    ids = {name: str(engine.inspect_image(docker_client, tag)["Id"]) for name, tag in seeds.items()}  # type: ignore[index]
    digests = {name: reg.tag_digest(normalize.RAW_REPOSITORY, tag) for name, tag in raws.items()}
    assert all(digests.values()) and len(set(digests.values())) == 3
    newest = int(docker_client.api.images(name=seeds["newest"])[0]["Created"])
    try:
        freed = gc.gc(cache, older_than_s=86400, registry_host=host)
        # a seed another test's build made meanwhile is the engine's newest: then "newest" may go as well
        elsewhere = [i for i in docker_client.api.images(name=ccache.REPOSITORY)
                     if i["Id"] not in ids.values() and int(i["Created"]) >= newest]
        assert freed.removed["seeds"] == [seeds["ended"]] or (
            elsewhere and sorted(freed.removed["seeds"]) == sorted([seeds["ended"], seeds["newest"]]))
        assert engine.inspect_image(docker_client, seeds["ended"]) is None
        assert engine.inspect_image(docker_client, ids["ended"]) is None  # the image, unused, went too
        assert not ccache.hold_path(cache, seeds["ended"]).exists()
        assert freed.kept_live["seeds"] == [seeds["live"]]
        for name in ("live", "other", "newest"):  # held by a live run; another cache's; the engine's newest
            assert engine.inspect_image(docker_client, seeds[name]) is not None or (name == "newest" and elsewhere), name
        assert freed.removed["raw layers"] == [f"{host}/{normalize.RAW_REPOSITORY}:{raws['ended']}"]
        assert raws["ended"] not in reg.tags(normalize.RAW_REPOSITORY)
        assert not normalize.raw_hold_path(cache, raws["ended"]).exists()
        assert freed.kept_live["raw layers"] == [raws["live"]]
        assert reg.tag_digest(normalize.RAW_REPOSITORY, raws["live"]) == digests["live"]
        assert reg.tag_digest(normalize.RAW_REPOSITORY, raws["other"]) == digests["other"]
    finally:
        for tag in seeds.values():
            engine.untag(docker_client, tag)
        for name, digest in digests.items():
            if digest:
                reg.delete_manifest(normalize.RAW_REPOSITORY, digest)
