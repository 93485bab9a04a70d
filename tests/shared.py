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
from typing import TypeVar

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
