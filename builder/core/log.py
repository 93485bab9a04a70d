"""Progress on stderr with per-step timings (like cibuildwheel's logger), and a long phase's progress lines."""
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.core import faults
from builder.core.safetext import clip

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
