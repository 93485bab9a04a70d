"""`builder gc`: free what finished runs left in the cache, the engine and the local registry.

Retention rule (docs/image.md, "What the cache keeps"). A run is live while its process holds
`<cache>/live/<run id>.lock` (every command holds its own); whatever a live run holds is never touched, and
in the engine and the registry gc removes only what a run of this cache made (its hold file is here): an
engine shared by several caches keeps the others' things. Of the rest, gc removes:

    contexts     builds/<sha>/context.tar that no live build holds (a build drops its own when it ends);
                 builds/<sha>/ whole (Dockerfile, context.sha256, logs) once older than the age
    run dirs     runs/<name>-<time>/ older than the age, except the newest `keep_runs` of each pins name, its
                 newest ACCEPTED one, and its newest ACCEPTED nightly run in the history (the nightly compares with
                 it: runs by hand cannot push it out)
    logs         logs/<run id>/ of runs not live, older than the age
    seeds        compiler-cache seed images this cache's runs used and no live one holds, except the newest
    raw layers   builder-raw/layers manifests in the local registry that this cache's runs pushed and no
                 live one holds (the registry frees the blobs on its own garbage-collect)
    run tags     builder-run/<run id>:* of this cache's runs that ended before the age; then the image if unused;
                 then the run's live/<run id>.lock (a bisect's candidates are its run's local names: these)
    bisect       bisect/<name>-<hash>/ (state file, candidates' pins and reports, answer) of bisects not live (the run
                 id in its state file), older than the age

`older_than_s` is the age (default a week); 0 frees everything no live run holds.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from builder.core import files as fs
from builder.core import log
from builder.core.imageref import ImageRef
from builder.core.options import Settings
from builder.engine import client as engine
from builder.engine import infra, normalize
from builder.engine.registry import Registry
from builder.image import build as build_stage
from builder.image import ccache, context
from builder.nightly.history import History
from builder.release import sqsh_layout

WEEK_S = 7 * 86400
KEEP_RUNS = 20


@dataclass
class Freed:
    """What gc removed (and kept because a live run holds it), for its JSON answer."""
    removed: dict[str, list[str]] = field(default_factory=dict)
    kept_live: dict[str, list[str]] = field(default_factory=dict)
    bytes: int = 0
    refused: list[str] = field(default_factory=list)  # what the registry would not delete (405)

    def gone(self, kind: str, what: str, size: int = 0) -> None:
        self.removed.setdefault(kind, []).append(what)
        self.bytes += size

    def live(self, kind: str, what: str) -> None:
        self.kept_live.setdefault(kind, []).append(what)


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def newest_mtime(path: Path) -> float:
    times = [path.stat().st_mtime] + [p.stat().st_mtime for p in path.rglob("*") if not p.is_symlink()]
    return max(times)


def live(settings: Settings, run_id: str) -> bool:
    return fs.held(settings.live_lock(run_id))


def ended(path: Path) -> bool:
    """A hold file of this cache whose holders have all ended (a missing one: not this cache's)."""
    return path.exists() and not fs.held(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def contexts(settings: Settings, cutoff: float, freed: Freed) -> None:
    for out_dir in sorted(settings.cache("builds").iterdir()):
        if not out_dir.is_dir() or out_dir.name.startswith("."):
            continue
        if fs.held(context.hold_path(out_dir)):
            freed.live("contexts", str(out_dir))
            continue
        tar = out_dir / "context.tar"
        if newest_mtime(out_dir) < cutoff:
            freed.gone("builds", str(out_dir), size_of(out_dir))
            _remove(out_dir)
        elif tar.exists():
            freed.gone("contexts", str(tar), tar.stat().st_size)
            context.drop(tar)


def _verdict(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / "report.json").read_text()).get("verdict", ""))
    except (OSError, ValueError):
        return ""


def nightly_baselines(settings: Settings) -> set[Path]:
    """Per pins name in the history, the run directory of its newest ACCEPTED nightly run (none without a
    history: gc never makes one)."""
    path = settings.cache("history") / "runs.sqlite"
    if not path.is_file():
        return set()
    history = History(path)
    found = (history.last_accepted(name) for name in history.names())
    return {Path(run.report_path).parent.resolve() for run in found if run is not None}


def run_dirs(settings: Settings, cutoff: float, keep: int, freed: Freed) -> None:
    baselines = nightly_baselines(settings)
    groups: dict[str, list[Path]] = {}
    for run_dir in settings.cache("runs").iterdir():
        if run_dir.is_dir():
            groups.setdefault(run_dir.name[:-16] if len(run_dir.name) > 16 else run_dir.name, []).append(run_dir)
    for dirs in groups.values():
        dirs.sort(key=lambda d: d.stat().st_mtime, reverse=True)
        accepted = next((d for d in dirs if _verdict(d) == "ACCEPTED"), None)
        for run_dir in dirs[keep:]:
            if run_dir != accepted and run_dir.resolve() not in baselines and newest_mtime(run_dir) < cutoff:
                freed.gone("runs", str(run_dir), size_of(run_dir))
                _remove(run_dir)


def bisect_dirs(settings: Settings, cutoff: float, freed: Freed) -> None:
    for out_dir in sorted(settings.cache("bisect").iterdir()):
        if not out_dir.is_dir():
            continue
        try:  # builder/bisect/answer.py's state file (bisect comes after nightly: it cannot be imported here)
            run_id = str(json.loads((out_dir / "bisect-state.json").read_text()).get("run_id") or "")
        except (OSError, ValueError, AttributeError):
            run_id = ""
        if run_id and live(settings, run_id):
            freed.live("bisect", str(out_dir))
        elif newest_mtime(out_dir) < cutoff:
            freed.gone("bisect", str(out_dir), size_of(out_dir))
            _remove(out_dir)


def logs(settings: Settings, cutoff: float, freed: Freed) -> None:
    for run_log in settings.cache("logs").iterdir():
        if not run_log.is_dir() or run_log.name == "nightly":
            continue
        if live(settings, run_log.name):
            freed.live("logs", str(run_log))
        elif newest_mtime(run_log) < cutoff:
            freed.gone("logs", str(run_log), size_of(run_log))
            _remove(run_log)


def sqsh_files(settings: Settings, cutoff: float, freed: Freed) -> None:
    for directory, place in sqsh_layout.places(settings).items():
        kept = sorted(directory.glob(f"{sqsh_layout.PREFIX}*.sqsh")) if directory.is_dir() else []
        named = sqsh_layout.named(directory) if kept else set()
        for blob in kept:
            if blob.name not in named and blob.stat().st_mtime < cutoff:
                freed.gone(".sqsh", str(blob), blob.stat().st_size)
                blob.unlink()
                sqsh_layout.sums_path(blob).unlink(missing_ok=True)
        if not any(b.exists() for b in kept):  # nothing kept there any more: the directory is forgotten
            place.unlink(missing_ok=True)
    for rec in sqsh_layout.records(settings):  # a pointer removed (by hand, or its directory) needs no record
        if not Path(rec.pointer).is_symlink():
            sqsh_layout.forget(settings, rec.pointer)


def seeds(client: engine.Client, settings: Settings, freed: Freed) -> None:
    for image in engine.local_images(client, ccache.REPOSITORY)[1:]:
        for tag in image.tags:
            if not tag.startswith(ccache.REPOSITORY + ":"):
                continue
            held = ccache.hold_path(settings, tag)
            if fs.held(held):
                freed.live("seeds", tag)
            elif ended(held) and engine.untag(client, tag):
                held.unlink(missing_ok=True)
                freed.gone("seeds", tag, image.size)
                engine.remove_unused(client, image.id)


def raw_layers(settings: Settings, host: str, freed: Freed) -> None:
    reg = Registry.from_settings(host, settings)
    for tag in sorted(reg.tags(normalize.RAW_REPOSITORY)):
        held = normalize.raw_hold_path(settings, tag)
        if fs.held(held):
            freed.live("raw layers", tag)
            continue
        digest = reg.tag_digest(normalize.RAW_REPOSITORY, tag) if ended(held) else None
        if digest and reg.delete_manifest(normalize.RAW_REPOSITORY, digest):
            freed.gone("raw layers", f"{host}/{normalize.RAW_REPOSITORY}:{tag}")
            held.unlink(missing_ok=True)
    freed.refused += reg.refused


def run_tags(client: engine.Client, settings: Settings, cutoff: float, freed: Freed) -> None:
    for image in engine.local_images(client, build_stage.LOCAL_REPOSITORY + "/*"):
        for tag in image.tags:
            run_id = ImageRef(tag).repository.removeprefix(build_stage.LOCAL_REPOSITORY + "/")
            held = settings.live_lock(run_id)
            if fs.held(held):
                freed.live("run tags", tag)
            elif ended(held) and held.stat().st_mtime < cutoff and engine.untag(client, tag):
                freed.gone("run tags", tag)
        if engine.remove_unused(client, image.id):
            freed.bytes += image.size
    for held in settings.cache("live").glob("*.lock"):  # ended runs with nothing left to free
        if not fs.held(held) and held.stat().st_mtime < cutoff and not engine.local_images(
                client, f"{build_stage.LOCAL_REPOSITORY}/{held.stem}"):
            held.unlink(missing_ok=True)


def gc(settings: Settings, older_than_s: float = WEEK_S, keep_runs: int = KEEP_RUNS,
       registry_host: str | None = None, now: float | None = None, client: engine.Client | None = None) -> Freed:
    """Apply the retention rule (module docstring); never touches what a live run holds. `client`: the use case's
    engine client (a direct caller, a test, leaves it out and gc connects)."""
    cutoff = (time.time() if now is None else now) - older_than_s
    freed = Freed()
    with log.step("gc: cache (contexts, builds, runs, bisects, logs)"):
        contexts(settings, cutoff, freed)
        run_dirs(settings, cutoff, keep_runs, freed)
        bisect_dirs(settings, cutoff, freed)
        logs(settings, cutoff, freed)
        sqsh_files(settings, cutoff, freed)
    client = client or engine.connect(settings)  # direct callers only: the use case passes its client
    with log.step("gc: engine (compiler-cache seeds, run tags)"):
        seeds(client, settings, freed)
        run_tags(client, settings, cutoff, freed)
    with log.step("gc: local registry (raw layers)"):
        raw_layers(settings, registry_host or f"{infra.REGISTRY_HOST}:{infra.REGISTRY_PORT}", freed)
    counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(freed.removed.items())) or "nothing"
    log.info(f"gc: removed {counts} ({freed.bytes / 1e6:.1f} MB); kept what "
             f"{len({x for v in freed.kept_live.values() for x in v})} live holds name")
    return freed
