"""The build use case and the steps every use case starts with: the pins read once, sources resolved, the lock
checked against the pins (`checked_lock`), render and build; `builder setup`, `lock`, `resolve`, `render`, `build`.
`EngineDoor` is a use case's one engine client, connected when a stage first needs it and passed down.

    pins.load -> sources.resolve -> lock.record (checked fresh) -> image.render -> image.build
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from builder.core import log
from builder.core.errors import BuildFailed, InfraError, StaleLock
from builder.core.options import Settings
from builder.core.records import BuiltImage, RenderedBuild, ResolvedSources
from builder.engine import client as engine
from builder.engine import infra, platforms
from builder.image import build as build_stage
from builder.image import context as build_context
from builder.image import render as render_stage
from builder.lock import lockfile
from builder.lock import record as lock_record
from builder.lock.record import Lock
from builder.pins import model as pins_model
from builder.pins.model import Pins
from builder.sources import resolve as sources


class EngineDoor:
    """A use case's one engine client: connected when a stage first needs it (so a refusal before that, a stale
    lock or a bad report, never needs a reachable engine), then passed down to every stage of the use case."""

    def __init__(self, settings: Settings, client: engine.Client | None = None) -> None:
        self.settings, self._client = settings, client

    def client(self) -> engine.Client:
        if self._client is None:
            self._client = engine.connect(self.settings)
        return self._client


def setup(settings: Settings) -> dict[str, Any]:
    """Start the Docker engine (network none) and the local registry, if not running."""
    with log.step("setup engine and registry"):
        return infra.ensure_all(settings)


def load_pins(path: Path) -> Pins:
    with log.step("load pins"):
        return pins_model.load(path)


def pins_schema() -> str:
    """The JSON Schema of pins files (builder/pins/schema/pins.schema.json is this text)."""
    return pins_model.schema_json()


def resolve(pins: Pins, settings: Settings, offline: bool = False, allow_moved_pr: bool = False) -> ResolvedSources:
    with log.step("resolve sources"):
        resolved = sources.resolve(pins, settings, offline=offline, allow_moved_pr=allow_moved_pr)
    log.info(sources.format_table(resolved))
    return resolved


def checked_lock(pins: Pins, resolved: ResolvedSources, settings: Settings, offline: bool = False) -> Lock:
    """The pins' lock, read once; BadInput (exit 2, the line `lock --check` prints) when it is stale for the
    pins: nothing is rendered or built from it. A base pinned by an index without base.platform is refused first."""
    platforms.refuse_missing_platform(pins.base.image, pins.base.platform, settings)
    lock = lock_record.of(pins)
    try:
        lockfile.check_fresh(settings, pins, resolved, lock, offline)
    except StaleLock as stale:
        raise stale.as_bad_input() from None
    return lock


def render(pins: Pins, lock: Lock, resolved: ResolvedSources, settings: Settings,
           review: bool = False) -> RenderedBuild:
    """The base resolved to base.platform's manifest (an index without it: exit 2, nothing built), then render.
    `review` (`builder render`, nothing is built): a base its registry cannot serve here is named in one line and
    the Dockerfile names the pinned digest as written."""
    with log.step("render"):
        try:
            base: platforms.BaseManifest | None = platforms.resolve(pins.base.image, pins.base.platform, settings)
        except (BuildFailed, InfraError) as err:
            if not review:
                raise
            log.info(f"base: not read from its registry ({str(err)[:200]}); FROM names the pinned digest")
            base = None
        if base is not None and base.index_digest:
            log.info(f"base: index {base.index_digest} -> {pins.base.platform} manifest {base.digest}")
        return render_stage.render(pins, lock, resolved, settings, base)


def render_pins_only(pins: Pins) -> str:
    """The Dockerfile from the pins alone: nothing fetched, no context, trees unresolved (a review render,
    never built: the lock is read, not checked against the commits)."""
    return render_stage.render_dockerfile(pins, lock_record.of(pins), None)


def build(rendered: RenderedBuild, settings: Settings, nocache: bool = False, quiet: bool = False,
          client: engine.Client | None = None) -> BuiltImage:
    """Build the rendered context on the engine (`client`: the calling use case's; the build use case connects)."""
    with log.step("build"):
        try:
            return build_stage.build(rendered, settings, nocache=nocache, echo=not quiet,
                                     client=EngineDoor(settings, client).client())
        finally:  # a rebuild renders again; the Dockerfile, context.sha256 and the log stay
            build_context.build_ended(Path(rendered.context_path))


def lock(pins_path: Path, settings: Settings, check: bool = False, offline: bool = False, resolver: str = "uv",
         build_sdists: bool = False, allow_moved_pr: bool = False, upgrade: bool = False) -> lockfile.LockResult:
    """Write (or with `check`, verify) the pins' lock and fill the wheelhouse (`upgrade`: resolve again
    even when the inputs are unchanged)."""
    started = time.monotonic()
    lockfile.check_resolver(resolver)
    if not check:
        lockfile.start_lock_file(pins_path)
    pins = load_pins(pins_path)
    platforms.refuse_missing_platform(pins.base.image, pins.base.platform, settings)  # exit 2 before anything
    with log.step("lock: resolve sources"):
        resolved = sources.resolve(pins, settings, offline=offline, allow_moved_pr=allow_moved_pr)
    return lockfile.lock(pins, resolved, settings, check=check, resolver_name=resolver, build_sdists=build_sdists,
                         offline=offline, upgrade=upgrade, started=started)
