"""Build stage: send a rendered context to the engine (network none), tag it with the sha tag, check
what the build container saw (only loopback, no host mounts) and record how it went."""
from __future__ import annotations

import calendar
import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from acceptance import procfs  # one mountinfo parser (proc(5)), also used in the image
from builder.core import files as fs
from builder.core import log
from builder.core.constants import BUILDER_VERSION
from builder.core.errors import BuildFailed
from builder.core.evidence import BuildIsolation
from builder.core.imageref import ImageRef
from builder.core.options import PACKAGE, Settings
from builder.core.records import BuiltImage, RenderedBuild
from builder.engine import basecontainer, normalize, registry, staging
from builder.engine import client as engine
from builder.image import ccache
from builder.image.dockerfile import instructions

MARKER = "BUILD-ENV "  # the line smoke.py prints in the runtime stage's last step
SYSTEM_MOUNTS = ("/proc", "/dev", "/sys")
LOCAL_REPOSITORY = "builder-run"  # local tags: builder-run/<run id>:<sha tag>, one repository per run
RUN_TAG_MAX_AGE_S = 24 * 3600  # another run's local tag older than this is removed by the next build
SWEEP_EVERY_S = 3600  # a build sweeps those at most this often per cache and engine (sweep_due)
ENGINE_FILES = ("/etc/resolv.conf", "/etc/hostname", "/etc/hosts")  # the engine's own per-container files


def stage_times(dockerfile: str, steps: list[engine.Step], total: float) -> dict[str, float]:
    """Seconds per stage group (`# stage:` comments in the Dockerfile), plus the total."""
    groups = instructions(dockerfile)
    times: dict[str, float] = {}
    for step in steps:
        group = groups[step.index - 1][0] if step.total == len(groups) else "unknown"
        times[group] = round(times.get(group, 0.0) + step.seconds, 3)
    times["total"] = total
    return times


def cached_stages(dockerfile: str, steps: list[engine.Step]) -> list[str]:
    """Stage groups whose every step (FROM and ARG aside) was an engine cache hit: their seconds are this
    run's cache lookups, not a build."""
    groups = instructions(dockerfile)
    seen: dict[str, bool] = {}
    for step in steps:
        if step.total != len(groups) or step.instruction.upper().startswith(("FROM ", "ARG ")):
            continue
        group = groups[step.index - 1][0]
        seen[group] = seen.get(group, True) and step.cached
    return [group for group, cached in seen.items() if cached]


def all_cached(steps: list[engine.Step]) -> bool:
    """Every step but FROM and a global ARG reported `Using cache` (those never do)."""
    return bool(steps) and all(s.cached for s in steps if not s.instruction.upper().startswith(("FROM ", "ARG ")))


def build_env(steps: list[engine.Step]) -> dict[str, Any] | None:
    """What the build container reported (smoke.py's BUILD-ENV line); None when that step was cached."""
    for step in steps:
        for line in step.lines:
            if line.startswith(MARKER):
                data: dict[str, Any] = json.loads(line[len(MARKER):])
                return data
    return None


def isolation_problems(env: dict[str, Any], host_paths: list[str]) -> list[str]:
    """Anything but loopback, or any mount besides the root overlay, /proc, /dev, /sys and the
    engine's resolv.conf/hostname/hosts."""
    problems = []
    if env.get("net") != ["lo"]:
        problems.append(f"network interfaces {env.get('net')} (expected only lo)")
    for mount in procfs.mounts("\n".join(env.get("mountinfo", []))):
        root, point = mount["root"], mount["mount_point"]
        system = point == "/" or any(point == m or point.startswith(m + "/") for m in SYSTEM_MOUNTS)
        engine_file = point in ENGINE_FILES and "/containers/" in root and root.endswith(point.rsplit("/", 1)[1])
        if not (system or engine_file):
            problems.append(f"mount {root} on {point}")
        elif any(root == h or root.startswith(h.rstrip("/") + "/") for h in host_paths):
            problems.append(f"host path {root} mounted on {point}")
    return problems


def isolation(steps: list[engine.Step], settings: Settings, rendered: RenderedBuild) -> BuildIsolation:
    env = build_env(steps)
    if env is None:
        return {"checked": False, "reason": "the reporting step was cached; checked when it ran"}
    host_paths = [str(settings.cache_root), str(PACKAGE.parent), str(Path(rendered.context_path).parent)]
    return {"checked": True, "net": env.get("net"), "mountinfo": env.get("mountinfo", []),
            "problems": isolation_problems(env, host_paths)}


def check_labels(attrs: dict[str, Any], labels: dict[str, str], ref: str) -> None:
    found = (attrs.get("Config") or {}).get("Labels") or {}
    wrong = sorted(k for k, v in labels.items() if found.get(k) != v)
    if wrong:
        raise BuildFailed(f"{ref}: built image lacks the rendered labels {wrong}")


def steps_file(built: BuiltImage) -> Path:
    """Per-step record of one build: step, instruction, seconds, cached, image (short ID)."""
    return Path(built.log_path[: -len(".log")] + ".steps.json")


def local_tag(rendered: RenderedBuild, settings: Settings) -> str:
    """This run's local name of the build: `builder-run/<run id>:<tag of the rendered ref>`. Only this run moves
    it; release tags are given by promote (builder/release/promote.py), and later stages use the image ID."""
    return f"{LOCAL_REPOSITORY}/{settings.run_id}:{ImageRef(rendered.tag).tag}"


def drop_chain(client: engine.Client, steps: list[engine.Step]) -> int:
    """Remove the intermediate images a no-cache build made (newest first). The engine takes the newest
    match as a cache parent, so this chain would shadow the cached one: the next build would follow it and
    miss from the first step where the two differ (the compiler-cache seed). What another build still uses
    is left. Returns how many went."""
    made = [s.image for s in steps if s.image and not s.cached and not s.instruction.startswith(("FROM ", "ARG "))]
    removed = sum(engine.remove_unused(client, image) for image in reversed(list(dict.fromkeys(made))))
    log.info(f"no-cache build: removed {removed} intermediate image(s), so they do not shadow the layer cache")
    return removed


def sweep_run_tags(client: engine.Client, settings: Settings, now: float | None = None) -> list[str]:
    """Untag other runs' local names older than RUN_TAG_MAX_AGE_S (the run ID starts with its UTC start time),
    so a nightly does not pin one image per night forever; the images become prunable. A run ID without
    that time (BUILDER_RUN_ID set by hand) is kept. Returns the tags removed."""
    now = time.time() if now is None else now
    removed = []
    for image in engine.local_images(client, LOCAL_REPOSITORY + "/*"):
        for tag in image.tags:
            try:
                run = ImageRef(tag).name.removeprefix(LOCAL_REPOSITORY + "/")
                started = calendar.timegm(time.strptime(run[:14], "%Y%m%d%H%M%S"))
            except ValueError:
                continue
            if run != settings.run_id and now - started > RUN_TAG_MAX_AGE_S and engine.untag(client, tag):
                removed.append(tag)
    if removed:
        log.info(f"removed {len(removed)} local tag(s) of runs older than {RUN_TAG_MAX_AGE_S // 3600} h")
    return removed


def reproducible(client: engine.Client, raw_id: str, rendered: RenderedBuild, settings: Settings,
                 source: str = "registry") -> normalize.Normalized:
    """Normalise the engine's image (builder/engine/normalize.py) and load it under this run's local tag: each
    added layer at its own source date (a render without them: the created label's date for all)."""
    base_config, base_layers = staging.base_of(rendered.labels, settings)
    epochs = rendered.layer_epochs or normalize.epoch_of(rendered.labels["org.opencontainers.image.created"])
    host = registry.parse_repository(rendered.labels[staging.BASE_NAME]).host  # the label render wrote
    return normalize.normalize(client, raw_id, local_tag(rendered, settings), base_config, base_layers, epochs,
                               settings, registry_host=host, source=source)


def engine_key(settings: Settings) -> str:
    return hashlib.sha256((settings.docker_host or "default").encode()).hexdigest()[:16]


def sweep_due(settings: Settings, now: float | None = None) -> bool:
    """True at most once per SWEEP_EVERY_S for this cache and engine (a stamp's modification time): listing the
    engine's images costs it time per image it holds (seconds on one with thousands), and the tags swept are a day
    old anyway. Two builds may both find it due; both sweeps are harmless."""
    stamp = settings.cache("locks") / f"sweep-run-tags-{engine_key(settings)}.stamp"
    now = time.time() if now is None else now
    try:
        if now - stamp.stat().st_mtime < SWEEP_EVERY_S:
            return False
    except FileNotFoundError:
        pass
    stamp.touch()
    os.utime(stamp, (now, now))
    return True


def engine_lock(settings: Settings, exclusive: bool) -> contextlib.AbstractContextManager[Any]:
    """The build lock of this cache's engine: shared for a normal build, exclusive for a no-cache one. Until
    drop_chain removes a no-cache build's fresh chain of layers, the engine would take that chain as the cache
    parent of another build's steps (which then misses the cache, and keeps the chain alive): anything that
    builds without the cache on an engine holds it exclusively until its chain is gone."""
    return fs.locked(settings.cache("locks") / f"engine-build-{engine_key(settings)}.lock", exclusive=exclusive)


def key_lock(settings: Settings, rendered: RenderedBuild) -> contextlib.AbstractContextManager[Any]:
    """One build at a time per run identity (render.cache_key) on this engine. Two builds of one key that miss
    the cache together each make their own copy of the shared steps; the engine then takes either as the cache
    parent of later builds, whose layers differ from the first's for no change of theirs. The second build
    waits, then finds the first's layers."""
    name = f"engine-build-{engine_key(settings)}-{rendered.cache_key or 'unkeyed'}.lock"
    return fs.locked(settings.cache("locks") / name,
                     waiting=lambda: log.info(f"docker build {rendered.tag}: waiting for another build of this run"))


def build(rendered: RenderedBuild, settings: Settings, nocache: bool = False, echo: bool = True,
          client: engine.Client | None = None) -> BuiltImage:
    """Send the rendered context to the engine (network none), tag it with the sha tag, record it.
    Builds of different runs that share a cache and an engine run side by side, builds of one run one after
    another (key_lock), a no-cache build alone (engine_lock). `client`: the use case's engine client (a direct
    caller, a test or a benchmark, leaves it out and the build connects)."""
    with engine_lock(settings, exclusive=nocache):
        return build_locked(rendered, settings, nocache, echo, client)


def build_locked(rendered: RenderedBuild, settings: Settings, nocache: bool, echo: bool,
                 client: engine.Client | None = None) -> BuiltImage:
    """build() for a caller that holds engine_lock already (shared, or exclusive for nocache)."""
    with key_lock(settings, rendered):
        return _build_keyed(rendered, settings, nocache, echo, client)


def _build_keyed(rendered: RenderedBuild, settings: Settings, nocache: bool, echo: bool,
                 client: engine.Client | None) -> BuiltImage:
    client = client or engine.connect(settings)  # direct callers only: a use case passes its client
    out_dir = Path(rendered.context_path).parent
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{time.time_ns() % 10**9:09d}"
    log_path = out_dir / f"build-{stamp}.log"
    base = f"{rendered.labels[staging.BASE_NAME]}@{rendered.labels[staging.BASE_DIGEST]}"
    if not basecontainer.pull_base(client, base, settings):  # FROM: the base's own host's credentials only
        host = ImageRef(base).registry or "docker.io"
        raise BuildFailed(f"base image {base}: the engine could not pull it from {host}; check the credentials "
                          f"for {host} (docker login {host})")
    # a no-cache build (rebuild --check) compiles everything itself: no compiler cache either
    seed = ccache.prepare(client, settings, rendered.labels, settings.compiler_cache and not nocache)
    tag = local_tag(rendered, settings)
    with log.step(f"docker build {rendered.tag}"), open(rendered.context_path, "rb") as context:
        try:
            result = engine.build(client, context, tag, log_path, nocache=nocache, echo=echo,
                                  buildargs={ccache.ARG: seed.tag}, every=settings.progress_every_s,
                                  records=(MARKER,))  # BUILD-ENV: the build log and the report, not the console
        except BuildFailed as failed:  # a component that compiled before the failing step keeps its cache
            try:
                kept = ccache.harvest(client, seed, list(failed.steps))
                if kept:
                    log.info(f"compiler cache kept from the failed build: {ccache.summary(kept)}")
            except Exception as exc:  # best effort: the build's own failure is the error to report
                log.info(f"compiler cache not kept from the failed build: {type(exc).__name__}: {str(exc)[:200]}")
            raise
    compiled = ccache.harvest(client, seed, result.steps)
    if compiled:
        log.info(f"compiler cache: {ccache.summary(compiled)}")
        fs.write_atomic(out_dir / "ccache.json", json.dumps(compiled, indent=2, sort_keys=True) + "\n")
    attrs = engine.inspect_image(client, result.image_id)
    if attrs is None:
        raise BuildFailed(f"{rendered.tag}: image {result.image_id} vanished after the build")
    checked = isolation(result.steps, settings, rendered)
    problems = checked.get("problems") or []
    if problems:
        engine.remove_image(client, tag)
        engine.remove_image(client, result.image_id)  # drop the layers too: a cache hit must not skip the check
        raise BuildFailed(f"docker build {rendered.tag}: the build container was not isolated:"
                          f" {problems[0]}; log {log_path}", details=problems)
    check_labels(attrs, rendered.labels, tag)
    norm = reproducible(client, result.image_id, rendered, settings)
    attrs = engine.inspect_image(client, norm.image_id) or attrs
    times = stage_times(rendered.dockerfile, result.steps, result.seconds)
    times["normalise"] = norm.seconds  # this run's: a reused normalisation is its lookup, marked cached
    reused = cached_stages(rendered.dockerfile, result.steps) + (["normalise"] if norm.cached else [])
    built = BuiltImage(
        image_id=norm.image_id, raw_image_id=result.image_id, manifest_digest=norm.manifest_digest,
        source_date=normalize.iso(norm.source_date_epoch), tags=sorted(attrs.get("RepoTags") or []),
        size=int(attrs.get("Size") or 0),
        created=str(attrs.get("Created", "")), engine_version=engine.engine_version(client),
        builder_version=BUILDER_VERSION, context_sha256=rendered.context_sha256,
        dockerfile_sha256=rendered.dockerfile_sha256, base_digest=rendered.base_digest,
        base_index_digest=rendered.base_index_digest, stage_times=times, cached_stages=reused,
        log_path=result.log_path, cached=all_cached(result.steps),
        isolation=checked)
    steps = [{"step": s.index, "instruction": s.instruction, "seconds": s.seconds, "cached": s.cached,
              "image": s.image} for s in result.steps]
    fs.write_atomic(steps_file(built), json.dumps(steps, indent=2) + "\n")
    fs.write_atomic(out_dir / "steps.json", json.dumps(steps, indent=2) + "\n")  # the latest build
    fs.write_atomic(out_dir / "built.json", built.model_dump_json(indent=2) + "\n")
    if nocache:
        drop_chain(client, result.steps)
    if sweep_due(settings):
        sweep_run_tags(client, settings)
    log.info(f"built {tag} {norm.image_id[:19]} manifest {norm.manifest_digest} ({built.size / 1e6:.0f} MB,"
             f" {result.seconds:.1f} s{', all cached' if built.cached else ''})")
    return built
