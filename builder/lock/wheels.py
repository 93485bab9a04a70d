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
from builder.engine import basecontainer
from builder.lock import resolver

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


def missing_entries(directory: Path, entries: list[LockEntry]) -> list[LockEntry]:
    """The locked requirements with no file in `directory` whose sha256 they list."""
    have = {fs.sha256_file(p) for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith(".")}
    return [e for e in entries if not have.intersection(e.hashes)]


def built_from_sdist(text: str) -> dict[str, str]:
    """{name==version: wheel file name} of the lock's wheels that `builder lock` built from an sdist: no
    index serves them, only the cache that built them (lock lines `... # <wheel> built from sdist sha256 ...`)."""
    out = {}
    for line in text.replace("\\\n", " ").splitlines():
        entry, _, note = line.partition("#")
        if BUILT_MARK in note and entry.strip():
            out[entry.split()[0]] = next((w for w in note.split() if w.endswith(".whl")), "")
    return out


def pip_download(args: list[str], dest: Path, target: Target, logfile: Path, settings: Settings) -> None:
    """pip download from the configured index only, in the lock's environment: the host's pip configuration
    (constraints, extra indexes, find-links) never applies; its transport settings do (options._resolver_env)."""
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d", str(dest),
            *settings.index_args(), *target.pip_args(), *args]
    try:
        commands.run_logged(argv, logfile, "pip download", env=dict(settings.resolver_env))
    except InfraError as exc:
        raise InfraError(f"pip download: {basecontainer.cause(chr(10).join(exc.details))}; log {logfile}",
                         details=exc.details) from None


def no_match(logfile: Path) -> str:
    """The requirement pip names in `No matching distribution found for X` (the index has no such file)."""
    found = re.findall(r"No matching distribution found for (\S+)", "\n".join(fs.tail(logfile, 50)))
    return found[-1] if found else ""


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
        missing = missing_entries(dest, entries)
        built = built_from_sdist(text)
        lost = [f"{e.name}=={e.version}" for e in missing if f"{e.name}=={e.version}" in built]
        if lost:  # no index has it: only a `builder lock` with --build-sdists on this cache made it
            more = f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""
            raise BadInput(f"{where}: {lost[0]} ({built[lost[0]] or 'its wheel'}){more} was built from an sdist"
                           " by `builder lock`, no index serves it, and the wheelhouse lacks it: run `builder lock"
                           " --build-sdists` on these pins again with this BUILDER_CACHE, or copy the wheel into"
                           " the wheelhouse", details=[f"wheelhouse: {dest}", *(f"missing: {r} {built[r]}" for r in lost)])
        work = fs.part_dir(dest.parent, "wheels")
        logfile = settings.run_log("pip-download-lock")
        try:
            (work / "requirements.txt").write_text("".join(
                f"{e.name}=={e.version} " + " ".join(f"--hash=sha256:{h}" for h in e.hashes) + "\n" for e in missing))
            with log.step(f"pip download {len(missing)} wheels of {where.name} (cp{target.abi[2:]},"
                          f" {target.machine}; log {logfile})"):
                try:
                    pip_download(["--no-deps", "--require-hashes", "-r", str(work / "requirements.txt")],
                                 work / "wheels", target, logfile, settings)
                except InfraError:
                    cause = resolver.unreachable("\n".join(fs.tail(logfile, 200)))
                    if cause:  # pip says "no matching distribution" for an index it never reached too
                        raise InfraError(f"pip download: the index {resolver.shown_index(settings.index_url)} was"
                                         f" not reached: {cause}; log {logfile}") from None
                    req = no_match(logfile)
                    if req:
                        raise BadInput(f"{where}: {req} is not in the wheelhouse {dest} and the index"
                                       f" {settings.index_url} has no wheel of it for cp{target.abi[2:]}"
                                       f" {target.machine}; run `builder lock` on these pins again (log {logfile})"
                                       ) from None
                    raise
            for wheel in (work / "wheels").iterdir():  # each whole file renamed into place: no partial wheel
                os.replace(wheel, dest / wheel.name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if match_files(dest, entries) is None:
            raise InfraError(f"{dest}: downloaded wheels do not match the hashes in {where}")
        log.info(f"wheels for {where}: {len(entries)} in {dest}")
        return dest


BUILD_MARK = "# build: "  # a lock line needed only while building (builder lock writes it)
BUILT_MARK = "built from sdist"  # a lock line's note on a wheel builder lock built itself (no index has it)


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
