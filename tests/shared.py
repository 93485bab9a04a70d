"""Session fixtures computed once per `make test`, not once per pytest-xdist worker.

Under xdist every worker is its own process with its own session fixtures. A fixture whose value can be
pickled (paths, records, built images, acceptance results) is made by the first worker that asks for it,
under a file lock in the directory all workers' temp roots share, and read back by the others. Without
xdist it is made in-process, as before.
"""
from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from builder.core import files as fs

T = TypeVar("T")


def once(factory: pytest.TempPathFactory, name: str, make: Callable[[], T]) -> T:
    """make() for the first worker of this run that asks; its pickled value for every later one."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make()
    root: Path = factory.getbasetemp().parent  # pytest-of-<user>/pytest-N: shared by this run's workers
    path = root / f"shared-{name}.pickle"
    with fs.locked(root / f".shared-{name}.lock"):
        if path.is_file():
            value: T = pickle.loads(path.read_bytes())
            return value
        value = make()
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(value))
        tmp.replace(path)
        return value


# ---- engine listings that stay cheap on an engine with thousands of images (the SDK's images.list inspects
# every image it lists: minutes on a busy engine)


def image_ids(client: Any) -> set[str]:
    """Every image ID on the engine, intermediate ones too, in one call."""
    return {str(i["Id"]) for i in client.api.images(all=True)}


def local_tags(client: Any) -> list[str]:
    """Every local name:tag, in one call."""
    return [t for i in client.api.images() for t in (i.get("RepoTags") or []) if t != "<none>:<none>"]


def derived_images(client: Any, before: set[str], image_id: str) -> list[str]:
    """Images made since `before` (image_ids) that hold image_id's top layer: built on it."""
    import docker  # lazy, as the rest of the tests

    top = client.api.inspect_image(image_id)["RootFS"]["Layers"][-1]
    found = []
    for new in image_ids(client) - before:
        try:
            layers = client.api.inspect_image(new)["RootFS"].get("Layers") or []
        except docker.errors.NotFound:  # another worker's, removed meanwhile
            continue
        if top in layers:
            found.append(new)
    return sorted(found)
