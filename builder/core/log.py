"""Progress on stderr with per-step timings (like cibuildwheel's logger).

A step's `==> name` line is printed when the step first has something to say (a line of its own or of a
step inside it) or when it ends, so a step that refuses bad input (BadInput) prints nothing of its own:
the refusal stays the one `error:` line on stderr.
"""
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from builder.core import faults
from builder.core.errors import BadInput

timings: dict[str, float] = {}
_pending: list[str] = []  # open steps whose `==>` line is not printed yet, outermost first


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def info(message: str) -> None:
    while _pending:
        _say(f"==> {_pending.pop(0)}")
    _say(message)


@contextmanager
def step(name: str) -> Iterator[None]:
    _pending.append(name)
    mark = len(_pending)
    faults.point(name)  # a test may hold the run here and inject a fault (builder/core/faults.py)
    start = time.monotonic()
    status: str | None = " FAILED"
    try:
        yield
        status = ""
    except BadInput:
        if len(_pending) >= mark:  # nothing printed inside: the refusal is the only line
            del _pending[mark - 1:]
            status = None
        raise
    finally:
        took = time.monotonic() - start
        timings[name] = round(took, 3)
        if status is not None:
            info(f"<== {name} ({took:.2f} s){status}")
