"""Resolve requirements for the base's interpreter and platform, and download their wheels.

What the base provides is fixed: each installed distribution becomes a stub wheel (name and
version only) in a find-links folder and a `name==version` constraint, so the resolver keeps it
and never upgrades or replaces it. The target is the base's Python, ABI and glibc, never the
host's. Two resolvers give the same answer: uv (`uv pip compile`, the default: faster, see
benchmarks/bench_lock_resolver.py) and pip (`pip install --dry-run --report`).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from builder.core import faults
from builder.core.errors import BadInput, InfraError
from builder.core.options import Settings
from builder.engine.basecontainer import BaseInfo
from builder.lock import download

SPENT: dict[str, float] = {}  # seconds per part of a lock, for the table `builder lock` prints


@contextmanager
def spent(what: str) -> Iterator[None]:
    """Add the block's seconds to SPENT[what]; not in worker threads (their caller's block counts them)."""
    start = time.monotonic()
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            SPENT[what] = SPENT.get(what, 0.0) + time.monotonic() - start


UV_GLIBC = [(2, 17), (2, 28)] + [(2, n) for n in range(31, 41)]  # what `uv --python-platform` knows
RESOLVERS = ("uv", "pip")


@dataclass(frozen=True)
class Target:
    python: str
    abi: str
    machine: str
    glibc: tuple[int, int]

    @classmethod
    def of(cls, base: BaseInfo) -> Target:
        return cls(base.python, base.abi, base.machine, base.glibc)

    def platforms(self) -> list[str]:
        return [f"manylinux_{self.glibc[0]}_{minor}_{self.machine}" for minor in range(self.glibc[1], 16, -1)] + \
            [f"manylinux2014_{self.machine}", f"linux_{self.machine}"]

    def pip_args(self) -> list[str]:
        args = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp"]
        for abi in (self.abi, "abi3", "none"):
            args += ["--abi", abi]
        for platform in self.platforms():
            args += ["--platform", platform]
        return args

    def uv_platform(self) -> str:
        known = [g for g in UV_GLIBC if g <= self.glibc]
        if not known:
            raise BadInput(f"base.image: glibc {self.glibc[0]}.{self.glibc[1]} is older than manylinux2014")
        return f"{self.machine}-manylinux_{known[-1][0]}_{known[-1][1]}"




def stub_wheels(provided: dict[str, str], directory: Path) -> None:
    """One metadata-only wheel per provided distribution (the base's, the components')."""
    for name, version in sorted(provided.items()):
        stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
        path = directory / f"{stem}-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as whl:
            info = f"{stem}.dist-info"
            whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
            whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: builder-lock-stub\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
            whl.writestr(f"{info}/RECORD", "")


def _run(settings: Settings, argv: list[str], log_name: str) -> tuple[int, str]:
    logfile = settings.run_log(log_name)
    proc = subprocess.run(argv, check=False, env=dict(settings.resolver_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, text=True)
    logfile.write_text("$ " + " ".join(argv) + "\n" + proc.stdout)
    if proc.returncode != 0 and faults.disk_message(proc.stdout):  # a full disk is no resolution conflict
        raise InfraError(f"{Path(argv[0]).name}: {faults.disk_message(proc.stdout)} (log {logfile})")
    return proc.returncode, proc.stdout


# what uv and pip print when the index could not be reached (no answer, as opposed to an answer of no solution)
UNREACHABLE = re.compile(r"error sending request for url|tcp connect error|dns error|failed to lookup address"
                         r"|Connection refused|NewConnectionError|Failed to establish a new connection"
                         r"|ConnectTimeoutError|ReadTimeoutError|Temporary failure in name resolution"
                         r"|Network is unreachable|No route to host|ProxyError|Max retries exceeded", re.I)

CAUSE = re.compile(r"(?:Failed to establish a new connection|Connection refused|tcp connect error|dns error"
                   r"|failed to lookup address|Temporary failure in name resolution|Network is unreachable"
                   r"|No route to host|timed out)[^'\"\n]*", re.I)


def unreachable(output: str) -> str:
    """The line that says the index was not reached ('' when the index answered): infrastructure (3), never
    a resolution conflict or a missing distribution (bad input, 2)."""
    if re.search(r"no solution found|conflict is caused by", output, re.I):
        return ""
    lines = [" ".join(ln.split()) for ln in output.splitlines() if UNREACHABLE.search(ln)]
    if not lines:
        return ""
    found = CAUSE.search(lines[-1])  # the words of the cause, not a wrapper's repr around them
    return (found.group(0) if found else lines[-1])[:200]


def refused(output: str, tool: str, log_name: str, settings: Settings) -> InfraError | BadInput:
    """A failed resolution by its cause: the index not reached is InfraError, anything else BadInput."""
    cause = unreachable(output)
    if cause:
        return InfraError(f"{tool}: the index {shown_index(settings.index_url)} was not reached: {cause}"
                          f" (log {settings.run_log(log_name)})")
    return BadInput(_explain(output))


def shown_index(url: str) -> str:
    """The index URL as the lock states it: without a user name or password."""
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname or ""
    return urlunsplit(parts._replace(netloc=host))


def shown_links(links: tuple[str, ...]) -> str:
    """`, find-links: A B` as the lock header states BUILDER_FIND_LINKS (empty when unset)."""
    return f", find-links: {' '.join(shown_index(link) for link in links)}" if links else ""


def uv_bin() -> str:
    from uv import find_uv_bin  # lazy: only when locking

    return find_uv_bin()


def resolver_version(resolver: str) -> str:
    if resolver == "uv":
        return subprocess.run([uv_bin(), "--version"], check=False, capture_output=True, text=True).stdout.strip()

    return f"pip {metadata.version('pip')}"


def resolve(settings: Settings, requirements: list[str], provided: dict[str, str], target: Target, resolver: str = "uv",
            log_name: str = "lock-resolve") -> dict[str, str]:
    """{canonical name: version} of the closure of requirements, without the provided ones.
    Raises BadInput with the resolver's explanation when there is no solution."""
    if not requirements:
        return {}
    with spent(f"resolve ({resolver})"), tempfile.TemporaryDirectory(prefix="lock-resolve-") as tmp:
        work = Path(tmp)
        (work / "stubs").mkdir()
        stub_wheels(provided, work / "stubs")
        (work / "req.in").write_text("".join(r + "\n" for r in requirements))
        (work / "constraints.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(provided.items())))
        # an sdist's metadata build on the host must never get a stub as its build backend
        (work / "build-constraints.txt").write_text("".join(f"{n}!={v}\n" for n, v in sorted(provided.items())))
        found = (_uv if resolver == "uv" else _pip)(settings, work, target, log_name)
    drop = {canonicalize_name(n) for n in provided}
    return {n: v for n, v in sorted(found.items()) if n not in drop}


def _uv(settings: Settings, work: Path, target: Target, log_name: str) -> dict[str, str]:
    argv = [uv_bin(), "pip", "compile", str(work / "req.in"), "-c", str(work / "constraints.txt"),
            "--find-links", str(work / "stubs"), *settings.index_args(),
            "--index-strategy", "unsafe-best-match", "--python-version", target.python,
            "--python-platform", target.uv_platform(), "--no-header", "--no-annotate", "--quiet",
            "--build-constraints", str(work / "build-constraints.txt"),
            "--cache-dir", str(settings.cache("uv")), "-o", str(work / "out.txt")]
    rc, output = _run(settings, argv, log_name)
    if rc != 0:
        raise refused(output, "uv", log_name, settings)
    found: dict[str, str] = {}
    for line in (work / "out.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and "==" in line:
            name, version = line.split(";", 1)[0].split("==", 1)
            found[canonicalize_name(name.split("[", 1)[0])] = version.strip()
    return found


def _pip(settings: Settings, work: Path, target: Target, log_name: str) -> dict[str, str]:
    argv = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet",
            "--report", str(work / "report.json"), "--target", str(work / "target"), *target.pip_args(),
            *settings.index_args(), "--find-links", str(work / "stubs"),
            "-c", str(work / "constraints.txt"), "-r", str(work / "req.in")]
    rc, output = _run(settings, argv, log_name)
    if rc != 0:
        raise refused(output, "pip", log_name, settings)
    report = json.loads((work / "report.json").read_text())
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def _explain(output: str) -> str:
    """The resolver's explanation on one line: from uv's 'No solution found' (or pip's 'conflict is caused by')
    to the end, its indented lists included (they say who requires what), else the lines that explain."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and not ln.startswith("$")]
    start = next((i for i, ln in enumerate(lines) if re.search(r"no solution found|conflict is caused by", ln, re.I)), None)
    if start is not None:
        text = " ".join(lines[start:])
    else:
        wanted = [ln for ln in lines if re.search(r"because|conflict|cannot|unsatisf|no matching", ln, re.IGNORECASE)]
        text = " ".join((wanted or lines)[-4:])
    text = " ".join(re.sub(r"[\u00d7\u2570\u2500\u25b6\u2502]+", " ", text).split())
    return text[:600] or "the resolver found no solution"


# --------------------------------------------------------------------------- downloads


def _pool_match(pool: Path, name: str, version: str, wheel: bool, supported: set[Tag] | None = None) -> Path | None:
    """The pool's file of name==version (a wheel or an sdist); a wheel only with a tag in `supported` (the target's:
    the pool holds every platform's wheels, an x86_64 one must not serve an aarch64 lock)."""
    for path in sorted(pool.iterdir()):
        try:
            if wheel and path.name.endswith(".whl"):
                dist, ver, _, tags = parse_wheel_filename(path.name)
                if supported is not None and supported.isdisjoint(tags):
                    continue
            elif not wheel and path.name.endswith((".tar.gz", ".zip")):
                dist, ver = parse_sdist_filename(path.name)
            else:
                continue
        except ValueError:
            continue
        if canonicalize_name(dist) == name and ver == Version(version):
            return path
    return None


def download_wheels(settings: Settings, pinned: dict[str, str], target: Target,
                    on_no_wheel: Callable[[str], None] | None = None) -> tuple[dict[str, Path], list[str]]:
    """({name: wheel for the target}, [name==version with no wheel for the target]); files are
    kept in <cache>/wheels/pool so a second lock downloads nothing. on_no_wheel(name) hears of a
    name with only an sdist as soon as the index says so (while the other downloads go on)."""
    with spent("wheels: pool and downloads"):
        return _download_wheels(settings, pinned, target, on_no_wheel)


NO_WHEEL_TTL_S = 86400  # how long "the index has no wheel of name==version for this target" is believed


def _no_wheel_marker(pool: Path, name: str, version: str, target: Target) -> Path:
    return pool / ".no-wheel" / f"{name}-{version}-{target.abi}-{target.uv_platform()}"


def _known_no_wheel(pool: Path, name: str, version: str, target: Target) -> bool:
    try:
        return time.time() - _no_wheel_marker(pool, name, version, target).stat().st_mtime < NO_WHEEL_TTL_S
    except OSError:
        return False


def _download_wheels(settings: Settings, pinned: dict[str, str], target: Target,
                     on_no_wheel: Callable[[str], None] | None) -> tuple[dict[str, Path], list[str]]:
    pool = settings.cache("wheels", "pool")
    supported = set(download.tags(target.python, target.abi, target.platforms()))
    known = [n for n, v in pinned.items()
             if _pool_match(pool, n, v, True, supported) is None and _known_no_wheel(pool, n, v, target)]
    for name in known:
        if on_no_wheel is not None:
            on_no_wheel(name)
    missing = [n for n, v in pinned.items() if _pool_match(pool, n, v, True, supported) is None and n not in known]
    sdist_only: set[str] = set()

    def heard(name: str) -> None:
        sdist_only.add(name)
        if on_no_wheel is not None:
            on_no_wheel(name)

    if missing:  # in parallel through the index's JSON API; what that cannot get, pip below
        fetched = download.fetch(settings, {n: pinned[n] for n in missing}, target.python, target.abi,
                                 target.platforms(), pool, heard)
        asked = list(missing)
        missing = [n for n in missing if n not in fetched and n not in sdist_only]
    else:
        asked = []
    if missing:
        start = time.monotonic()
        reqs = [f"{n}=={pinned[n]}" for n in missing]
        rc, _ = _run(settings, [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "-d", str(pool),
                      *target.pip_args(), *settings.index_args(), *reqs], "lock-download")
        if rc != 0:  # find which ones have no wheel, one at a time
            for req in reqs:
                _run(settings, [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "-d", str(pool),
                      *target.pip_args(), *settings.index_args(), req], "lock-download-one")
        download.TOTALS.add(time.monotonic() - start, 0, 0)
    files, no_wheel = {}, []
    for name, version in pinned.items():
        path = _pool_match(pool, name, version, True, supported)
        if path is None:
            no_wheel.append(f"{name}=={version}")
            marker = _no_wheel_marker(pool, name, version, target)
            if name in asked:  # the index was asked just now
                marker.parent.mkdir(exist_ok=True)
                marker.touch()
        else:
            files[name] = path
    return files, no_wheel


def download_sdist(settings: Settings, name: str, version: str) -> Path:
    pool = settings.cache("wheels", "sdists")
    path = _pool_match(pool, name, version, False)
    if path is None:
        _, output = _run(settings, [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--no-binary=:all:",
                           "-d", str(pool), *settings.index_args(), f"{name}=={version}"], "lock-download-sdist")
        path = _pool_match(pool, name, version, False)
        if path is None:  # the index not reached is infrastructure; an index with no such file is bad input
            if unreachable(output):
                raise refused(output, "pip download", "lock-download-sdist", settings)
            raise BadInput(f"{name}=={version}: the index {shown_index(settings.index_url)} has neither a wheel"
                           f" for the base nor an sdist: {_explain(output)}")
    return path


def timed_resolve(settings: Settings, requirements: list[str], provided: dict[str, str], target: Target,
                  resolver: str) -> tuple[float, dict[str, str]]:
    start = time.monotonic()
    found = resolve(settings, requirements, provided, target, resolver, log_name=f"bench-resolve-{resolver}")
    return time.monotonic() - start, found
