"""A failed `builder lock` end to end (the CLI in a subprocess, the real engine and registry): `base_torch: true`
on a base without torch is one line and exit 2 before anything is installed, and a lock that fails after it
made containers leaves no container, image, local tag or registry repository behind (issue 28 items 1, 7).

The engine is shared with whatever else runs (other builds, other tests' sessions), so what a run made is
told by what carries its marks: the owner label on its containers (<host>:<pid>), its run ID in a tag or
name, and for item 1 the layers of the base it alone uses. The registry's repositories are compared whole."""
from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.engine import client as engine
from builder.engine import infra
from builder.engine.registry import Registry
from demo.prepare import add_pr_commit, variant_pins
from tests.shared import derived_images, image_ids, local_tags

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = infra.registry_url()
NO_TORCH_REPOSITORY = "tests/no-torch-base"
UNINSTALL = '["/opt/venv/bin/python", "-m", "pip", "uninstall", "-y", "torch"]'  # the demo base's venv (demo/baseimage.py)


def catalog() -> set[str]:
    """Every repository of the local registry (GET /v2/_catalog, page by page)."""
    reg, out, path = Registry(REGISTRY), set(), "/v2/_catalog?n=1000"
    while path:
        resp = reg._request("GET", path)
        assert resp.status_code == 200, resp.text
        out |= set(resp.json().get("repositories") or [])
        path = resp.links.get("next", {}).get("url", "")
    return out


@pytest.fixture(scope="session")
def no_torch_base(base_image: str, docker_client: Any) -> Iterator[tuple[str, str]]:
    """(`<registry>/tests/no-torch-base@sha256:...`, its image ID): the demo base with torch uninstalled
    (a network-none build), pushed by digest; its tag, image and manifest are removed at the end."""
    repository, tag = f"{REGISTRY}/{NO_TORCH_REPOSITORY}", f"s{os.getpid()}-{uuid.uuid4().hex[:8]}"
    dockerfile = f"FROM {base_image}\nRUN {UNINSTALL}\n".encode()
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile), network_mode="none", pull=False, rm=True,
                                          forcerm=True, tag=f"{repository}:{tag}")
    digest = ""
    try:
        for item in docker_client.api.push(repository, tag=tag, stream=True, decode=True):
            assert "error" not in item, item
        digest = Registry(REGISTRY).tag_digest(NO_TORCH_REPOSITORY, tag) or ""
        assert f"{repository}@{digest}" in docker_client.images.get(image.id).attrs["RepoDigests"]
        yield f"{repository}@{digest}", str(image.id)
    finally:
        if digest:
            Registry(REGISTRY).delete_manifest(NO_TORCH_REPOSITORY, digest)
        engine.untag(docker_client, f"{repository}:{tag}")
        # the same build elsewhere (a cache hit: another session's tag) shares the image: it stays for that one
        engine.remove_unused(docker_client, str(image.id))


@dataclass
class LockRun:
    rc: int
    stderr: str
    seconds: float
    owner: str      # the owner label its containers carry
    run_id: str
    cache: Path     # its BUILDER_CACHE
    started: int    # engine event window (unix seconds)
    ended: int

    def logs(self) -> list[str]:
        where = self.cache / "logs" / self.run_id
        return sorted(p.name for p in where.iterdir()) if where.is_dir() else []


def builder_lock(pins: Path, cache: Path, run_id: str) -> LockRun:
    env = {**os.environ, "BUILDER_CACHE": str(cache), "BUILDER_RUN_ID": run_id}
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "builder", "lock", str(pins)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=600)
    ended = time.time()
    return LockRun(proc.returncode, err, ended - started, f"{socket.gethostname()}:{proc.pid}", run_id, cache,
                   int(started) - 1, int(ended) + 2)


def container_events(docker_client: Any, run: LockRun) -> dict[str, int]:
    """How often each action happened to the containers the run made (by their owner label)."""
    counts: dict[str, int] = {}
    for event in docker_client.events(since=run.started, until=run.ended, decode=True,
                                      filters={"type": "container", "label": f"{engine.OWNER_LABEL}={run.owner}"}):
        action = str(event.get("Action") or event.get("status")).split(":")[0]
        counts[action] = counts.get(action, 0) + 1
    return counts


def left_behind(docker_client: Any, run: LockRun, repositories_before: set[str]) -> dict[str, list[str]]:
    """What the run left on the engine and the registry (empty lists when nothing)."""
    mark = f"{engine.OWNER_LABEL}={run.owner}"
    return {
        "containers": [c.name for c in docker_client.containers.list(all=True, filters={"label": mark})],
        "images": [str(i["Id"]) for i in docker_client.api.images(all=True, filters={"label": mark})],
        "tags": [t for t in local_tags(docker_client) if run.run_id in t],
        # the run's repositories are named after it (with_marks); other workers push their own meanwhile
        "repositories": sorted(r for r in catalog() - repositories_before if run.run_id in r),
        "holds": sorted(p.name for p in run.cache.glob("*/held/*")),  # seeds and raw layers a run would hold
    }


NOTHING: dict[str, list[str]] = {"containers": [], "images": [], "tags": [], "repositories": [], "holds": []}


def with_marks(out: Path, run_id: str, edit: Any) -> Path:
    """The demo pins copied into out, with the image repository named after the run (any push would show)."""
    def change(data: dict[str, Any]) -> None:
        data["image"]["repository"] = f"{REGISTRY}/tests/{run_id}/unified"
        edit(data)
    return variant_pins(out, edit=change)


# ---------------------------------------------------------------- item 1


@pytest.mark.docker
@pytest.mark.slow  # the no-torch base: a build and a push once per session
def test_base_torch_on_a_base_without_torch_is_one_line_exit_2_before_anything_is_installed(
        tmp_path: Path, demo_pins: Path, no_torch_base: tuple[str, str], docker_client: Any) -> None:
    ref, image_id = no_torch_base
    run_id = f"i28-notorch-{uuid.uuid4().hex[:8]}"

    def no_torch(data: dict[str, Any]) -> None:
        data["base"]["image"] = ref
        data["components"]["vllm"]["base_torch"] = True

    pins = with_marks(tmp_path, run_id, no_torch)
    lock_before = (tmp_path / "locks" / "demo.lock").read_bytes()
    before = catalog()
    images_before = image_ids(docker_client)
    run = builder_lock(pins, tmp_path / "cache", run_id)
    assert run.rc == 2, run.stderr
    named = [line for line in run.stderr.splitlines() if "base_torch" in line]
    assert len(named) == 1 and "no torch" in named[0], run.stderr
    assert f"components.vllm.base_torch: true, but the base has no torch (/opt/venv/bin/python in {ref}" in named[0]
    # at once: the base was read, nothing resolved, downloaded or prepared in a metadata container
    assert run.logs() == ["lock-base-query.log"], run.logs()
    assert not (run.cache / "wheels").exists() or not any((run.cache / "wheels").rglob("*.whl"))
    assert container_events(docker_client, run).get("create") == 1  # the base query's, and no other
    # nothing left behind
    assert left_behind(docker_client, run, before) == NOTHING
    assert derived_images(docker_client, images_before, image_id) == []
    assert (tmp_path / "locks" / "demo.lock").read_bytes() == lock_before


# ---------------------------------------------------------------- item 7

PLANTED = 'raise RuntimeError("planted: tinyengine cannot prepare its metadata")\n'


@pytest.mark.docker
@pytest.mark.slow  # resolves and downloads tinyengine's build requirements
def test_a_lock_that_fails_after_making_containers_leaves_nothing_behind(tmp_path: Path, demo_pins: Path,
                                                                         docker_client: Any) -> None:
    run_id = f"i28-failed-{uuid.uuid4().hex[:8]}"

    def planted(data: dict[str, Any]) -> None:  # a PR author's commit whose setup.py raises at metadata time
        comp = data["components"]["vllm"]
        comp["commit"] = add_pr_commit(tmp_path / comp["url"], comp["pr"], "setup.py", PLANTED, "setup: planted")

    pins = with_marks(tmp_path, run_id, planted)
    assert yaml.safe_load(pins.read_text())["components"]["vllm"]["commit"]
    before = catalog()
    run = builder_lock(pins, tmp_path / "cache", run_id)
    assert run.rc == 1, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error: components.vllm: preparing metadata failed in the base (exit 1): RuntimeError:"
                           " planted: tinyengine cannot prepare its metadata; log "), last
    assert {"lock-base-query.log", "lock-metadata-vllm.log"} <= set(run.logs()), run.logs()
    events = container_events(docker_client, run)
    assert events.get("create", 0) >= 2 and events.get("destroy") == events["create"], events  # base query, metadata
    assert "commit" not in events, events
    assert left_behind(docker_client, run, before) == NOTHING
