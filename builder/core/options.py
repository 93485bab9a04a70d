"""Every setting read from the environment, read once into one frozen `Settings` (the pins file and
CLI flags are the rest). The CLI calls `Settings.from_env()` and passes the object down.

| variable | default | what |
|---|---|---|
| BUILDER_CACHE | `<checkout>/.cache`, installed: `~/.cache/rl-image-builder` | mirrors, wheels, contexts, runs, logs |
| BUILDER_REGISTRY_USERNAME / _PASSWORD | unset | basic auth for push and verify; never written anywhere |
| BUILDER_INDEX_URL | https://pypi.org/simple | package index `builder lock` resolves and downloads from |
| BUILDER_DEBIAN_MIRROR | http://deb.debian.org/debian | debootstrap mirror of the demo base image |
| BUILDER_ENGINE_TIMEOUT | 90 | seconds to wait for a started dockerd to answer |
| BUILDER_REGISTRY_TIMEOUT | 30 | seconds for a registry to answer (start-up and each HTTP call) |
| BUILDER_BUILD_TIMEOUT | 3600 | HTTP read timeout of a build: a step may print nothing for minutes |
| BUILDER_GIT_CONFIG | unset | a git config file included in every fetch, e.g. url.<base>.insteadOf mirrors (submodules too) |
| BUILDER_SIGNING_KEY | unset | ed25519 private key (PEM) that signs the attestations on publish |
| BUILDER_SQUASH_OPTIONS | -comp lzo -noD | mksquashfs compression of `export-sqsh` (enroot's ENROOT_SQUASH_OPTIONS default) |
| BUILDER_RUN_ID | random | scopes this run's local names (image tags `builder-run/<id>:...`); `[a-z0-9-]`, 1..32 |
| DOCKER_HOST | the local socket | which Docker engine (`unix://`, `tcp://`, `ssh://`) |
| DOCKER_TLS_VERIFY / DOCKER_CERT_PATH | unset | TLS for a `tcp://` engine, as the Docker CLI reads them |
"""
from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builder.core.errors import BadInput

PACKAGE = Path(__file__).resolve().parent


def _default_cache() -> Path:
    checkout = PACKAGE.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "builder" / "cli.py").is_file():
        return checkout / ".cache"
    return Path.home() / ".cache" / "rl-image-builder"


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise BadInput(f"{name}: expected seconds in (0, 86400], got {text[:40]!r}")
    return value


def _resolver_env(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """No host find-links, constraints or caps leak into a lock; a CA bundle pip was given still applies."""
    out = {k: v for k, v in env.items() if not k.startswith(("PIP_", "UV_"))}
    out.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_CONFIG="1")
    if env.get("PIP_CERT"):
        out["SSL_CERT_FILE"] = out["PIP_CERT"] = env["PIP_CERT"]
    return tuple(sorted(out.items()))
ENROOT_SQUASH_OPTIONS = "-comp lzo -noD"   # enroot's default (doc/configuration.md, doc/cmd/import.md)
SQUASH_WORD = re.compile(r"-[a-zA-Z][a-zA-Z0-9-]*|[a-z0-9][a-z0-9._]*")
SQUASH_REFUSED = ("-noappend", "-root-becomes", "-pf", "-sort", "-ef", "-cpiostyle", "-tar")


def check_squash_options(value: str, where: str) -> str:
    """mksquashfs compression options: flags and plain values only (no paths, no shell)."""
    words = value.split()
    if not words or not all(SQUASH_WORD.fullmatch(w) for w in words) or any(w in SQUASH_REFUSED for w in words):
        raise BadInput(f"{where}: expected mksquashfs compression options like {ENROOT_SQUASH_OPTIONS!r}, got {value!r}")
    return " ".join(words)


def _git_config(env: Mapping[str, str]) -> Path | None:
    """BUILDER_GIT_CONFIG: an existing git config file, made absolute (git includes it by path)."""
    value = env.get("BUILDER_GIT_CONFIG", "")
    if not value:
        return None
    path = Path(value).resolve()
    if not path.is_file():
        raise BadInput(f"BUILDER_GIT_CONFIG: expected an existing git config file, got {value!r}")
    return path


def failpoint() -> tuple[str, str]:
    """BUILDER_FAILPOINT and BUILDER_FAILPOINT_HOLD, read at each fail point (tests only; builder/core/faults.py)."""
    return os.environ.get("BUILDER_FAILPOINT", ""), os.environ.get("BUILDER_FAILPOINT_HOLD", "")


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment plus `extra`, for a child `builder` process (builder/nightly/fleet.py)."""
    return {**os.environ, **extra}


RUN_ID = re.compile(r"(?=.{1,32}$)[a-z0-9]+(?:-[a-z0-9]+)*")


def new_run_id() -> str:
    return time.strftime("%Y%m%d%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


PROCESS_RUN_ID = new_run_id()  # one run per process unless BUILDER_RUN_ID says otherwise


def _run_id(env: Mapping[str, str]) -> str:
    value = env.get("BUILDER_RUN_ID", "")
    if not value:
        return PROCESS_RUN_ID
    if not RUN_ID.fullmatch(value):
        raise BadInput(f"BUILDER_RUN_ID: expected 1..32 of [a-z0-9] in words joined by single '-', got {value[:40]!r}")
    return value


@dataclass(frozen=True)
class Settings:
    cache_root: Path
    registry_auth: tuple[str, str] | None
    debian_mirror: str
    engine_timeout_s: float
    registry_timeout_s: float
    build_timeout_s: float
    docker_host: str | None
    docker_tls_verify: str | None = None
    docker_cert_path: str | None = None
    index_url: str = "https://pypi.org/simple"
    # the environment of `builder lock`'s pip/uv runs: the host's, minus its pip/uv configuration
    resolver_env: tuple[tuple[str, str], ...] = ()
    git_config: Path | None = None
    # the environment of the git CLI fetches (ssh agent, proxies, HOME for credentials; no BUILDER_*)
    git_env: tuple[tuple[str, str], ...] = ()
    signing_key: Path | None = None
    squash_options: str = ENROOT_SQUASH_OPTIONS
    # this run's scope for local names: concurrent runs on one engine never share a mutable tag
    run_id: str = PROCESS_RUN_ID

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        user = env.get("BUILDER_REGISTRY_USERNAME", "")
        password = env.get("BUILDER_REGISTRY_PASSWORD", "")
        if bool(user) != bool(password):
            raise BadInput("BUILDER_REGISTRY_USERNAME / BUILDER_REGISTRY_PASSWORD: expected both set or both unset")
        return cls(
            cache_root=Path(env.get("BUILDER_CACHE") or _default_cache()).absolute(),
            registry_auth=(user, password) if user else None,
            debian_mirror=env.get("BUILDER_DEBIAN_MIRROR") or "http://deb.debian.org/debian",
            engine_timeout_s=_seconds(env, "BUILDER_ENGINE_TIMEOUT", 90.0),
            registry_timeout_s=_seconds(env, "BUILDER_REGISTRY_TIMEOUT", 30.0),
            build_timeout_s=_seconds(env, "BUILDER_BUILD_TIMEOUT", 3600.0),
            docker_host=env.get("DOCKER_HOST") or None,
            docker_tls_verify=env.get("DOCKER_TLS_VERIFY") or None,
            docker_cert_path=env.get("DOCKER_CERT_PATH") or None,
            index_url=env.get("BUILDER_INDEX_URL") or "https://pypi.org/simple",
            resolver_env=_resolver_env(env),
            git_config=_git_config(env),
            git_env=tuple(sorted((k, v) for k, v in env.items() if not k.startswith("BUILDER_"))),
            signing_key=Path(env["BUILDER_SIGNING_KEY"]) if env.get("BUILDER_SIGNING_KEY") else None,
            squash_options=check_squash_options(env.get("BUILDER_SQUASH_OPTIONS") or ENROOT_SQUASH_OPTIONS,
                                                "BUILDER_SQUASH_OPTIONS"),
            run_id=_run_id(env),
        )

    def docker_environment(self) -> dict[str, str]:
        """What the Docker SDK's from_env reads, from these settings only."""
        pairs = {"DOCKER_HOST": self.docker_host, "DOCKER_TLS_VERIFY": self.docker_tls_verify,
                 "DOCKER_CERT_PATH": self.docker_cert_path}
        return {k: v for k, v in pairs.items() if v}

    def cache(self, *parts: str) -> Path:
        """A directory under the cache root, created on first use."""
        path = self.cache_root.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def __repr__(self) -> str:  # never show the password
        auth = "set" if self.registry_auth else "unset"
        return f"Settings(cache_root={str(self.cache_root)!r}, registry_auth={auth}, docker_host={self.docker_host!r})"
