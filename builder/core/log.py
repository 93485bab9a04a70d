"""Progress on stderr with per-step timings (like cibuildwheel's logger), and a long phase's progress lines.

A step's `==> name` line is printed when the step first has something to say (a line of its own or of a
step inside it), once it has run for SHOW_AFTER_S, or when it ends; so a step that refuses bad input
(BadInput) at once prints nothing of its own: the refusal stays the one `error:` line on stderr.
"""
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.core import faults
from builder.core.errors import BadInput
from builder.core.safetext import clip

timings: dict[str, float] = {}
_pending: list[str] = []  # open steps whose `==>` line is not printed yet, outermost first
_lock = threading.Lock()
SHOW_AFTER_S = 2.0  # a step still running after this long shows its `==>` line


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _flush() -> None:
    with _lock:
        while _pending:
            _say(f"==> {_pending.pop(0)}")


def info(message: str) -> None:
    with _lock:
        while _pending:
            _say(f"==> {_pending.pop(0)}")
        _say(message)


@contextmanager
def step(name: str) -> Iterator[None]:
    with _lock:
        _pending.append(name)
        mark = len(_pending)
    timer = threading.Timer(SHOW_AFTER_S, _flush)
    timer.daemon = True
    timer.start()
    faults.point(name)  # a test may hold the run here and inject a fault (builder/core/faults.py)
    start = time.monotonic()
    status: str | None = " FAILED"
    try:
        yield
        status = ""
    except BadInput:
        with _lock:
            if len(_pending) >= mark:  # nothing printed inside: the refusal is the only line
                del _pending[mark - 1:]
                status = None
        raise
    finally:
        timer.cancel()
        took = time.monotonic() - start
        timings[name] = round(took, 3)
        if status is not None:
            info(f"<== {name} ({took:.2f} s){status}")


COUNT = re.compile(r"\[(\d+)/(\d+)\]")  # ninja's and make-like step counts: [123/499]
EVERY_S = 30.0  # default: at most one progress line this often


class Progress:
    """A long phase (debootstrap, apt, a compile) on the console: its log named once at the start, then at
    most one line every `every` seconds: time so far, the last step count seen (`[123/499]`), the last output
    line, and the log again. `feed` takes the phase's output; `tick` prints when a line is due."""

    def __init__(self, what: str, logfile: Path | str, every: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.logfile, self.every, self.clock = what, str(logfile), every, clock
        self.started = self.printed = clock()
        self.stage = ""   # e.g. a build's `step 5/12`, set by the caller
        self.count = ""   # the last [n/m] seen
        self.latest = ""  # the last non-empty output line
        self.lines = 0    # progress lines printed
        info(f"    {what}: writing {self.logfile} (progress every {every:g} s)")

    def feed(self, text: str) -> None:
        for line in text.splitlines():
            if line.strip():
                self.latest = line.strip()
            found = COUNT.findall(line)
            if found:
                self.count = "[{}/{}]".format(*found[-1])
        self.tick()

    def tick(self) -> None:
        now = self.clock()
        if now - self.printed >= self.every:
            self.printed = now
            self.lines += 1
            info(self.line(now))

    def line(self, now: float) -> str:
        count = self.count if self.count not in self.latest else ""  # ninja's line starts with it
        head = ", ".join(p for p in (f"{now - self.started:.0f} s", self.stage, count) if p)
        latest = clip(self.latest, 100) if self.latest else "no output yet"
        return f"    {self.what}: {head}: {latest} (log {self.logfile})"
