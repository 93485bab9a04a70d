"""A base pinned by a multi-arch index: resolved to the platform manifest the build uses.

Real bases (NGC PyTorch, Docker Hub's python) are OCI image indexes or Docker manifest lists, and the digest people
copy from `docker pull` is the index's. The build must not let the engine pick a platform: the base is resolved here
to the entry for `base.platform`, normalised as the engine does (`linux/arm64` is arm64 with variant v8, a missing
variant matches), and the Dockerfile names that platform manifest's digest. Both digests are recorded (report,
provenance, build record); only the platform manifest's reaches the image, so one manifest pinned two ways gives one
image. An index without the platform is refused before anything is built (exit 2)."""
from __future__ import annotations

import json
import platform as host_platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.errors import BadInput, BuildFailed, InfraError, PublishError
from builder.core.imageref import ImageRef
from builder.core.options import Settings
from builder.engine.registry import INDEX_TYPES, Registry

DEFAULT_VARIANT = {"arm64": "v8", "arm": "v7"}  # what the engine assumes when a platform names none
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}  # an architecture's `uname -m`
BINFMT = Path("/proc/sys/fs/binfmt_misc")  # qemu-user-static's entries, qemu-<machine>, when registered


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    @classmethod
    def parse(cls, text: str) -> Platform:
        """'linux/arm64', 'linux/arm64/v8', 'linux/amd64'."""
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise BadInput(f"base.platform: expected os/architecture[/variant], got {text!r}")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else "")

    def normal(self) -> Platform:
        """The engine's spelling: arm64 without a variant is arm64/v8, and variant '8' is 'v8'."""
        variant = self.variant or DEFAULT_VARIANT.get(self.architecture, "")
        return Platform(self.os, self.architecture, f"v{variant}" if variant.isdigit() else variant)

    def matches(self, entry: dict[str, Any]) -> bool:
        """An index entry's platform is this one: os and architecture equal, variants equal once both are
        normalised, or the entry names none."""
        other = Platform(str(entry.get("os", "")), str(entry.get("architecture", "")), str(entry.get("variant", "")))
        mine, theirs = self.normal(), other.normal()
        return (mine.os, mine.architecture) == (theirs.os, theirs.architecture) and (
            not other.variant or mine.variant == theirs.variant)

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


@dataclass(frozen=True)
class BaseManifest:
    """The base the build uses: its name, the platform manifest's digest, and the index's when one was pinned."""
    name: str
    digest: str
    index_digest: str | None = None

    @property
    def reference(self) -> str:
        return f"{self.name}@{self.digest}"


def choose(index: dict[str, Any], platform: str, where: str) -> str:
    """The digest of the index entry for `platform`; BadInput naming the platforms the index has."""
    wanted = Platform.parse(platform)
    entries = [m for m in index.get("manifests") or [] if isinstance(m, dict)]
    found = [m for m in entries if isinstance(m.get("platform"), dict) and wanted.matches(m["platform"])]
    if not found:
        have = sorted({str(Platform(str(m["platform"].get("os", "")), str(m["platform"].get("architecture", "")),
                                    str(m["platform"].get("variant", ""))))
                       for m in entries if isinstance(m.get("platform"), dict)})
        raise BadInput(f"base.image: the index {where} has no {platform} entry (it has {', '.join(have) or 'none'});"
                       " pin a base built for base.platform, or set base.platform to one of those")
    return str(found[0]["digest"])


def resolve(image: str, platform: str, settings: Settings) -> BaseManifest:
    """The base pinned in the pins (`name@sha256:...`), resolved to its platform manifest through its registry."""
    ref = ImageRef(image, need_digest=True)
    digest = str(ref.digest)
    reg = Registry.from_settings(ref.registry or "docker.io", settings)
    try:
        got = reg.manifest(ref.repository, digest)
    except PublishError as err:
        raise BuildFailed(f"base image {image}: {err}") from None
    if got["computed"] != digest:
        raise BuildFailed(f"base image {image}: the registry serves bytes hashing to {got['computed']}")
    body = json.loads(got["content"])
    base = BaseManifest(ref.name, digest)
    if (body.get("mediaType") or got["media_type"]) in INDEX_TYPES or "manifests" in body:
        base = BaseManifest(ref.name, choose(body, platform, f"{ref.name}@{digest}"), index_digest=digest)
        try:
            body = json.loads(reg.manifest_by_digest(ref.repository, base.digest))
        except PublishError as err:
            raise BuildFailed(f"base image {base.reference}: {err}") from None
    check_config(reg, ref.repository, body, platform, base.reference)
    return base


def refuse_missing_platform(image: str, platform: str, settings: Settings) -> None:
    """Before the lock and the build: a base whose index has no base.platform entry, or whose config names another
    platform, is refused (BadInput, exit 2). A base that cannot be read here (the registry down, a base only in the
    local engine) is left to the steps that read it, with their own errors."""
    try:
        resolve(image, platform, settings)
    except (BuildFailed, InfraError, PublishError):
        return


def check_config(reg: Registry, name: str, manifest: dict[str, Any], platform: str, where: str) -> None:
    """The platform manifest's config says the pinned platform (an index entry's platform is only a claim)."""
    try:
        config = json.loads(reg.blob(name, manifest["config"]["digest"]))
    except (PublishError, KeyError, TypeError) as err:
        raise BuildFailed(f"base image {where}: its config could not be read ({err})") from None
    if not Platform.parse(platform).matches(config):
        raise BadInput(f"base.platform: pinned {platform}, the base {where} is built for "
                       f"{Platform(str(config.get('os')), str(config.get('architecture')), str(config.get('variant') or ''))}")


def host_architecture() -> str:
    """This host's architecture as a platform names it (amd64, arm64): the local engine runs it natively."""
    machine = host_platform.machine()
    return next((arch for arch, m in MACHINES.items() if m == machine), machine)


def emulated(platform: str) -> bool:
    """An image of `platform` runs here under emulation (binfmt), not natively."""
    return Platform.parse(platform).architecture != host_architecture()


def runs_here(machine: str) -> bool:
    """Programs for `machine` (uname -m) run on this host: natively, or through a registered binfmt entry."""
    if machine == host_platform.machine():
        return True
    entry = BINFMT / f"qemu-{machine}"
    try:
        return entry.read_text().startswith("enabled")
    except OSError:
        return False


def needs_native(platform: str) -> str:
    """The reason a recipe gate is not run on an emulated platform (never pass: emulation says nothing of a node)."""
    arch = Platform.parse(platform).architecture
    return f"needs a native {arch} node (this {host_architecture()} engine runs {platform} under emulation)"
