"""Progress on stderr with per-step timings (like cibuildwheel's logger)."""
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from builder.core import faults

timings: dict[str, float] = {}


def info(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def step(name: str) -> Iterator[None]:
    info(f"==> {name}")
    faults.point(name)  # a test may hold the run here and inject a fault (builder/core/faults.py)
    start = time.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        took = time.monotonic() - start
        timings[name] = round(took, 3)
        info(f"<== {name} ({took:.2f} s){'' if ok else ' FAILED'}")
