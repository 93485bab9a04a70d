"""Every setting read from the environment, in one place (the pins file and CLI flags are the rest).

| variable | default | what |
|---|---|---|
| BUILDER_CACHE | <project>/.cache | mirrors, wheels, build contexts, runs, registry data, logs |
| BUILDER_REGISTRY_USERNAME / _PASSWORD | unset | basic auth for push and verify; never written anywhere |
| BUILDER_DEBIAN_MIRROR | http://deb.debian.org/debian | debootstrap mirror of the demo base image |
| BUILDER_ENGINE_TIMEOUT | 90 | seconds to wait for a started dockerd to answer |
| BUILDER_REGISTRY_TIMEOUT | 30 | seconds to wait for a started registry to answer |
| BUILDER_SQUASH_OPTIONS | -comp lzo -noD | mksquashfs options of `export-sqsh` (enroot's ENROOT_SQUASH_OPTIONS default) |
| DOCKER_HOST | the local socket | which Docker engine (read by the Docker SDK) |
"""
import os
import re
from pathlib import Path

from builder.errors import BadInput

PROJECT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    return Path(os.environ.get("BUILDER_CACHE") or PROJECT / ".cache")


def registry_credentials() -> tuple[str, str] | None:
    user = os.environ.get("BUILDER_REGISTRY_USERNAME", "")
    password = os.environ.get("BUILDER_REGISTRY_PASSWORD", "")
    if bool(user) != bool(password):
        raise BadInput("BUILDER_REGISTRY_USERNAME / BUILDER_REGISTRY_PASSWORD: expected both set or both unset")
    return (user, password) if user else None


def debian_mirror() -> str:
    return os.environ.get("BUILDER_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def engine_timeout_s() -> float:
    return float(os.environ.get("BUILDER_ENGINE_TIMEOUT", "90"))


def registry_timeout_s() -> float:
    return float(os.environ.get("BUILDER_REGISTRY_TIMEOUT", "30"))


ENROOT_SQUASH_OPTIONS = "-comp lzo -noD"   # enroot's default (doc/cmd/import.md, doc/configuration.md)
SQUASH_WORD = re.compile(r"-[a-zA-Z][a-zA-Z0-9-]*|[a-z0-9][a-z0-9._]*")


def check_squash_options(value: str, where: str) -> str:
    """mksquashfs compression options: flags and plain values only (no paths, no shell)."""
    words = value.split()
    if not words or not all(SQUASH_WORD.fullmatch(w) for w in words) or any(
            w in ("-noappend", "-root-becomes", "-pf", "-sort", "-ef", "-cpiostyle", "-tar") for w in words):
        raise BadInput(f"{where}: expected mksquashfs compression options like {ENROOT_SQUASH_OPTIONS!r}, got {value!r}")
    return " ".join(words)


def squash_options() -> str:
    return check_squash_options(os.environ.get("BUILDER_SQUASH_OPTIONS") or ENROOT_SQUASH_OPTIONS,
                                "BUILDER_SQUASH_OPTIONS")
