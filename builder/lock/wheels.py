"""The production wheelhouse: parse a hash-pinned lock and fetch its wheels on the host, for the
pins' target interpreter and platform (`pins.base.python`, `pins.base.platform`), never the host's.

A lock is pip's requirements format, every entry `name==version --hash=sha256:<hex> ...`. Wheels land
in `<cache>/wheels/lock/<sha256 of the lock>[:16]/` and are checked against the lock's hashes.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from builder.core import commands, log
from builder.core import files as fs
from builder.core.errors import BadInput, InfraError
from builder.core.options import Settings
from builder.core.safetext import show

REQ_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
HASH_RE = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}
GLIBC_MINORS = range(17, 40)  # manylinux_2_17 .. manylinux_2_39


@dataclass(frozen=True)
class LockEntry:
    name: str
    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Target:
    """What `pip download` fetches for: CPython version, ABI tags and platform tags."""
    python: str          # "3.12"
    machine: str         # "x86_64"

    @classmethod
    def from_base(cls, python: str, platform: str) -> Target:
        os_name, _, arch = platform.partition("/")
        arch = arch.split("/")[0]
        if os_name != "linux" or arch not in MACHINES:
            raise BadInput(f"base.platform: expected linux/amd64 or linux/arm64, got {platform!r}")
        if not re.fullmatch(r"3\.\d{1,2}", python):
            raise BadInput(f"base.python: expected a version like 3.12, got {python!r}")
        return cls(python=python, machine=MACHINES[arch])

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    def pip_args(self) -> list[str]:
        args = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp"]
        for abi in (self.abi, "abi3", "none"):
            args += ["--abi", abi]
        for minor in reversed(GLIBC_MINORS):
            args += ["--platform", f"manylinux_2_{minor}_{self.machine}"]
        return args + ["--platform", f"manylinux2014_{self.machine}", "--platform", "any"]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str, where: str = "lock") -> list[LockEntry]:
    """`name==version --hash=sha256:<hex> ...` entries (comments, continuations allowed)."""
    entries = []
    logical = re.sub(r"\\\n", " ", text)
    for lineno, line in enumerate(logical.splitlines(), 1):
        line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
        if not line:
            continue
        words = line.split()
        req = REQ_RE.match(words[0])
        if not req:
            raise BadInput(f"{where}:{lineno}: expected name==version, got {show(words[0], 80)}")
        hashes = []
        for word in words[1:]:
            match = HASH_RE.match(word)
            if not match:
                raise BadInput(f"{where}:{lineno}: expected --hash=sha256:<64 hex>, got {show(word, 80)}")
            hashes.append(match.group(1))
        if not hashes:
            raise BadInput(f"{where}:{lineno}: {show(words[0], 80)} has no --hash=sha256:")
        entries.append(LockEntry(req.group(1), req.group(2), tuple(hashes)))
    return entries


def wheel_name_version(filename: str) -> tuple[str, str]:
    if not filename.endswith(".whl"):
        raise InfraError(f"{filename}: not a wheel (only wheels are installed offline)")
    parts = filename[:-4].split("-")
    return parts[0], parts[1]


def match_files(directory: Path, entries: list[LockEntry]) -> dict[str, Path] | None:
    """Each locked requirement -> a file in `directory` whose sha256 it lists; None if any is missing."""
    by_hash: dict[str, Path] = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            by_hash.setdefault(fs.sha256_file(path), path)
    found = {}
    for entry in entries:
        match = next((by_hash[h] for h in entry.hashes if h in by_hash), None)
        if match is None:
            return None
        found[f"{entry.name}=={entry.version}"] = match
    return found


def pip_download(args: list[str], dest: Path, target: Target, logfile: Path) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d", str(dest),
            *target.pip_args(), *args]
    commands.run_logged(argv, logfile, "pip download")


def ensure_wheels(where: Path, text: str, wheel_key: bytes, target: Target, settings: Settings) -> Path:
    """The wheels of a hashed lock (its text, read once by builder/lock/record.py), downloaded once per lock
    and target, verified against the lock."""
    entries = parse_lock(text, str(where))
    dest = wheelhouse(wheel_key, target, settings)
    with fs.locked(dest.parent / f".{dest.name}.lock"):
        if match_files(dest, entries) is not None:
            log.info(f"wheels for {where}: reused {dest}")
            return dest
        fs.sweep_parts(dest.parent)  # what a killed run left
        work = fs.part_dir(dest.parent, "wheels")
        try:
            requirements = work / "requirements.lock"
            requirements.write_text(text)
            with log.step(f"pip download {where.name} (cp{target.abi[2:]}, {target.machine})"):
                pip_download(["--no-deps", "--require-hashes", "-r", str(requirements)], work, target,
                             settings.cache("logs") / "pip-download-lock.log")
            requirements.unlink()
            for wheel in work.iterdir():  # each whole file renamed into place: no partial wheel in dest
                os.replace(wheel, dest / wheel.name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if match_files(dest, entries) is None:
            raise InfraError(f"{dest}: downloaded wheels do not match the hashes in {where}")
        log.info(f"wheels for {where}: {len(entries)} in {dest}")
        return dest


BUILD_MARK = "# build: "  # a lock line needed only while building (builder lock writes it)


def split_lock(text: str) -> tuple[str, str]:
    """(runtime entries, build-only entries) of a lock; continuation lines are joined first."""
    runtime: list[str] = []
    build: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        if not line.split("#", 1)[0].strip():
            continue
        (build if BUILD_MARK in line else runtime).append(line)
    return "".join(ln + "\n" for ln in runtime), "".join(ln + "\n" for ln in build)


def wheelhouse(lock_data: bytes, target: Target, settings: Settings) -> Path:
    """Where the wheels of a lock for a target live (ensure_wheels fills and checks it)."""
    return settings.cache("wheels", "lock", hashlib.sha256(lock_data + repr(target).encode()).hexdigest()[:16])
