"""Parallel wheel downloads for the lock: the index's simple API (PEP 691 JSON) names each release's
files with their sha256; the best wheel for the target's tags (the order pip ranks them in) is fetched
by a pool of threads and checked against that sha256 before it enters the pool. A name the JSON API
does not answer for is left to `pip download` (resolver.download_wheels), as is finding which have no wheel.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import requests
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from builder.core.options import Settings

JSON = "application/vnd.pypi.simple.v1+json"
WORKERS = 8


@dataclass
class Totals:
    """What the lock's downloads cost, for the time table `builder lock` prints."""
    seconds: float = 0.0
    bytes: int = 0
    files: int = 0
    lock: Any = field(default_factory=threading.Lock)

    def add(self, seconds: float, size: int, files: int) -> None:
        with self.lock:
            self.seconds, self.bytes, self.files = self.seconds + seconds, self.bytes + size, self.files + files


    def reset(self) -> None:
        self.seconds, self.bytes, self.files = 0.0, 0, 0


TOTALS = Totals()


LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
MANYLINUX = re.compile(r"manylinux(?:_\d+_\d+|2014|2010|1)_(\w+)")


def expand(platforms: list[str]) -> list[str]:
    """pip's reading of --platform manylinux_2_17_<arch> / manylinux2014_<arch>: older manylinux too
    (manylinux_2_16 .. 2_5, manylinux2010, manylinux1), in that order, before linux_<arch>."""
    out = [p for p in platforms if not p.startswith("linux_")]
    machines = sorted({m.group(1) for p in platforms if (m := MANYLINUX.fullmatch(p))})
    for machine in machines:
        for minor in range(16, 4, -1):
            for name in (f"manylinux_2_{minor}_{machine}", f"{LEGACY[minor]}_{machine}" if minor in LEGACY else ""):
                if name and name not in out:
                    out.append(name)
    return out + [p for p in platforms if p.startswith("linux_")]


def tags(python: str, abi: str, platforms: list[str]) -> list[Tag]:
    """Supported tags, most preferred first (pip's order for --python-version/--abi/--platform)."""
    platforms = expand(platforms)
    version = tuple(int(x) for x in python.split("."))
    return list(cpython_tags(version, abis=[abi], platforms=platforms)) + \
        list(compatible_tags(version, interpreter=f"cp{python.replace('.', '')}", platforms=platforms))


def pick(files: list[dict[str, Any]], version: str, ranked: list[Tag], python: str) -> dict[str, Any] | None:
    """The file of `version` pip would take: a wheel with the best-ranked tag (then the highest build tag)."""
    rank = {tag: i for i, tag in enumerate(ranked)}
    best: tuple[int, int, str] | None = None
    chosen = None
    for item in files:
        name = item.get("filename", "")
        if not name.endswith(".whl") or not (item.get("hashes") or {}).get("sha256"):
            continue
        try:
            _, ver, build, file_tags = parse_wheel_filename(name)
        except (InvalidWheelFilename, ValueError):
            continue
        if ver != Version(version) or not _python_ok(item.get("requires-python"), python):
            continue
        score = min((rank[t] for t in file_tags if t in rank), default=None)
        if score is None:
            continue
        key = (score, -build[0] if build else 0, name)
        if best is None or key < best:
            best, chosen = key, item
    return chosen


def _python_ok(spec: str | None, python: str) -> bool:
    if not spec:
        return True
    try:
        return SpecifierSet(spec).contains(f"{python}.0", prereleases=True) or \
            SpecifierSet(spec).contains(python, prereleases=True)
    except InvalidSpecifier:
        return True


def _verify(settings: Settings) -> str | bool:
    env = dict(settings.resolver_env)
    return env.get("SSL_CERT_FILE") or env.get("REQUESTS_CA_BUNDLE") or True


def has_sdist(files: list[dict[str, Any]], version: str) -> bool:
    for item in files:
        try:
            if parse_sdist_filename(str(item.get("filename", "")))[1] == Version(version):
                return True
        except (InvalidSdistFilename, ValueError):
            continue
    return False


def _one(session: requests.Session, settings: Settings, name: str, version: str, ranked: list[Tag], python: str,
         pool: Path, on_no_wheel: Callable[[str], None] | None = None) -> Path | None:
    """Download name==version's wheel into pool; None when the JSON API or a wheel is not there."""
    index = settings.index_url.rstrip("/") + "/"
    try:
        resp = session.get(urljoin(index, f"{canonicalize_name(name)}/"), headers={"Accept": JSON}, timeout=60,
                           verify=_verify(settings))
        if resp.status_code != 200 or not resp.headers.get("content-type", "").startswith(JSON):
            return None
        files = resp.json().get("files", [])
        item = pick(files, version, ranked, python)
        if item is None:
            if has_sdist(files, version) and on_no_wheel is not None:
                on_no_wheel(name)  # the index has only an sdist of it for this target: no pip retry needed
            return None
        filename = str(item["filename"])
        out = pool / filename
        if out.exists():
            return out
        part = pool / f".{filename}.{os.getpid()}.{threading.get_ident()}.part"
        digest, size = hashlib.sha256(), 0
        with session.get(urljoin(resp.url, item["url"]), stream=True, timeout=300, verify=_verify(settings)) as got:
            got.raise_for_status()
            with open(part, "wb") as fh:
                for chunk in got.iter_content(1 << 20):
                    fh.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
        if digest.hexdigest() != item["hashes"]["sha256"]:
            part.unlink()
            return None
        os.replace(part, out)
        TOTALS.add(0.0, size, 1)
        return out
    except (requests.RequestException, ValueError, OSError):
        return None


def fetch(settings: Settings, wanted: dict[str, str], python: str, abi: str, platforms: list[str],
          pool: Path, on_no_wheel: Callable[[str], None] | None = None) -> dict[str, Path]:
    """{name: wheel} for what could be fetched in parallel; the rest is the caller's (pip download).
    on_no_wheel(name) is called (from a worker thread) as soon as the index shows only an sdist."""
    if not wanted:
        return {}
    ranked = tags(python, abi, platforms)
    start = time.monotonic()
    with requests.Session() as session, ThreadPoolExecutor(max_workers=WORKERS) as workers:
        session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=WORKERS))
        futures = {name: workers.submit(_one, session, settings, name, version, ranked, python, pool, on_no_wheel)
                   for name, version in sorted(wanted.items())}
        found = {name: path for name, future in futures.items() if (path := future.result()) is not None}
    TOTALS.add(time.monotonic() - start, 0, 0)
    return found
