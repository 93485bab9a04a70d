"""Helpers shared by the scripts that run inside the build (stdlib only, Python >= 3.8)."""
from __future__ import annotations

import base64
import hashlib
import re
import sysconfig
from pathlib import Path


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def same_version(a: object, b: object) -> bool:
    """Equal as PEP 440 versions (verl's __version__ "0.10.0.dev" is its metadata's "0.10.0.dev0"),
    with pip's vendored packaging (always in the image); as strings if either is not PEP 440."""
    from pip._vendor.packaging.version import InvalidVersion, Version

    try:
        return Version(str(a)) == Version(str(b))
    except InvalidVersion:
        return str(a) == str(b)


def built_from_vcs(built: str, scm: str) -> bool:
    """The installed version is the VCS version, or it with a local label a setup.py appends (vLLM's CPU
    build: 0.31.1.dev1+g9792a6a -> 0.31.1.dev1+g9792a6a.cpu); the host's rule (builder/sources/scmversion.py)."""
    return built == scm or built.startswith(scm + ("." if "+" in scm else "+"))


def site_dirs(prefix: str | None = None) -> list[str]:
    """purelib and platlib of the running interpreter, or of an install prefix."""
    where = {"base": prefix, "platbase": prefix} if prefix else None
    return sorted({sysconfig.get_path("purelib", vars=where), sysconfig.get_path("platlib", vars=where)})


def find_dist_info(distribution: str, dirs: list[str]) -> Path:
    """The single <name>-<version>.dist-info of a distribution in dirs, or SystemExit."""
    found = []
    for directory in dirs:
        for info in sorted(Path(directory).glob("*.dist-info")):
            meta = info / "METADATA"
            if meta.is_file():
                for line in meta.read_text(errors="replace").splitlines():
                    if line.startswith("Name:"):
                        if norm(line[5:].strip()) == norm(distribution):
                            found.append(info)
                        break
    if len(found) != 1:
        raise SystemExit(f"{distribution}: expected one installed dist-info in {dirs}, found {found}")
    return found[0]


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_hash(hex_digest: str) -> str:
    """RECORD's form of a sha256: sha256=<urlsafe base64, no padding>."""
    raw = bytes.fromhex(hex_digest)
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
