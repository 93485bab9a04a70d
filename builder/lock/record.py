"""The run's lock as one typed value, read once (`load`) and passed down beside `Pins`: its entries with
their hashes, the runtime / build-tools split, the native inputs, relaxed pins, direct URLs, what it was
written for (component commits, base digest), its path and sha256. No stage reads the lock file again.

`stale(...)` is the fast check that render, build and run make before they build: the native-input
declarations at the pinned commits (git only), then, when a commit or the base digest is not the one the
lock was written for, `builder lock --check`'s inputs check (lockfile.check).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from builder.core.constants import COMPONENTS
from builder.lock import native, wheels
from builder.pins import inputfile
from builder.pins.model import LOCK_MAX_BYTES, Pins

FOR_MARK = "# for: "  # base=<digest> vllm=<commit> megatron=<commit> verl=<commit>: what `builder lock` locked
FOR_RX = re.compile(r"(base|vllm|megatron|verl)=(sha256:[0-9a-f]{64}|[0-9a-f]{40})")


@dataclass(frozen=True)
class Lock:
    path: Path
    text: str
    sha256: str
    entries: tuple[wheels.LockEntry, ...]
    runtime: str                 # the entries installed into the image (pip requirements text)
    build: str                   # the build-only entries (build-tools prefix, never in the image)
    native: native.Locked
    inputs_sha256: str = ""      # the header's inputs-sha256 ("" when the lock has none)
    built_for: dict[str, str] = field(default_factory=dict)  # base / component -> digest / commit

    @property
    def relaxed(self) -> list[str]:
        return self.native.relaxed

    @property
    def direct(self) -> list[str]:
        return self.native.direct

    @property
    def wheel_key(self) -> bytes:
        """The bytes the wheelhouse is keyed by: the lock without its `# for:` line (a lock kept for a new
        commit with the same inputs keeps its wheels)."""
        return "".join(ln for ln in self.text.splitlines(keepends=True) if not ln.startswith(FOR_MARK)).encode()


def parse(text: str, path: Path) -> Lock:
    where = str(path)
    runtime, build = wheels.split_lock(text)
    inputs, built_for = "", {}
    for line in text.splitlines():
        if line.startswith("# inputs-sha256: "):
            inputs = line.split(": ", 1)[1].strip()
        elif line.startswith(FOR_MARK):
            built_for = dict(FOR_RX.findall(line))
    return Lock(path=path, text=text, sha256=hashlib.sha256(text.encode()).hexdigest(),
                entries=tuple(wheels.parse_lock(text, where)), runtime=runtime, build=build,
                native=native.parse(text, where), inputs_sha256=inputs, built_for=built_for)


def load(path: Path) -> Lock:
    """The lock file, read and parsed once; BadInput (one line naming it) when missing or unreadable."""
    text = inputfile.read_text(path, "lock file", LOCK_MAX_BYTES)
    return parse(text, Path(path))


def of(pins: Pins) -> Lock:
    return load(pins.lock_path())


def for_line(pins: Pins) -> str:
    return FOR_MARK + " ".join([f"base={pins.base.digest}", *(f"{n}={pins.components[n].commit}" for n in COMPONENTS)])


def moved(lock: Lock, pins: Pins) -> list[str]:
    """What the pins name that the lock was not written for: components whose commit moved, the base."""
    want = {"base": pins.base.digest, **{n: pins.components[n].commit for n in COMPONENTS}}
    return [k for k, v in want.items() if lock.built_for.get(k) != v]


def stale_message(lock_path: Path, changes: list[str], pins_path: Path) -> str:
    """The one line `builder lock --check` (and render / build / run) print for a stale lock."""
    more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
    return f"{lock_path}: stale: {changes[0]}{more}; run `builder lock {pins_path}`"
