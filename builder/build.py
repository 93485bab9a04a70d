"""Build a rendered context into the local image `<repository>:<sha tag>` and record how it went."""
from __future__ import annotations

import json
import time
from pathlib import Path

from acceptance import procfs  # one mountinfo parser (proc(5)), also used in the image
from builder import __version__ as BUILDER_VERSION
from builder import engine, log, normalize
from builder.errors import BuildFailed
from builder.records import BuiltImage, RenderedBuild
from builder.render import instructions


def stage_times(dockerfile: str, steps: list[engine.Step], total: float) -> dict[str, float]:
    """Seconds per stage group (`# stage:` comments in the Dockerfile), plus the total."""
    groups = instructions(dockerfile)
    times: dict[str, float] = {}
    for step in steps:
        group = groups[step.index - 1][0] if step.total == len(groups) else "unknown"
        times[group] = round(times.get(group, 0.0) + step.seconds, 3)
    times["total"] = total
    return times


def all_cached(steps: list[engine.Step]) -> bool:
    """Every step but FROM reported `Using cache` (FROM never does)."""
    return bool(steps) and all(s.cached for s in steps if not s.instruction.upper().startswith("FROM "))


SYSTEM_MOUNTS = ("/proc", "/dev", "/sys")
ENGINE_FILES = ("/etc/resolv.conf", "/etc/hostname", "/etc/hosts")  # the engine's own per-container files


def isolation_problems(build_env: dict, host_paths: list[str]) -> list[str]:
    """From smoke.py's record of the build container: anything but loopback, or any mount besides
    the root overlay, /proc, /dev, /sys and the engine's resolv.conf/hostname/hosts."""
    problems = []
    if build_env.get("net") != ["lo"]:
        problems.append(f"network interfaces {build_env.get('net')} (expected only lo)")
    for mount in procfs.mounts("\n".join(build_env.get("mountinfo", []))):
        root, point = mount["root"], mount["mount_point"]
        system = point == "/" or any(point == m or point.startswith(m + "/") for m in SYSTEM_MOUNTS)
        engine_file = point in ENGINE_FILES and root.startswith("/var/lib/docker/containers/")
        if not (system or engine_file):
            problems.append(f"mount {root} on {point}")
        elif any(root == h or root.startswith(h.rstrip("/") + "/") for h in host_paths):
            problems.append(f"host path {root} mounted on {point}")
    return problems


def check_labels(attrs: dict, labels: dict[str, str], ref: str) -> None:
    found = (attrs.get("Config") or {}).get("Labels") or {}
    wrong = sorted(k for k, v in labels.items() if found.get(k) != v)
    if wrong:
        raise BuildFailed(f"{ref}: built image lacks the rendered labels {wrong}")


def steps_file(built: BuiltImage) -> Path:
    """Per-step record of one build: step, instruction, seconds, cached, image (short ID)."""
    return Path(built.log_path[: -len(".log")] + ".steps.json")


BUILD_ENV_MARK = "builder-build-env: "  # printed by image_scripts/smoke.py into the build log


def build_env_file(built: BuiltImage) -> Path:
    """What the build container saw (network, mounts), from the build log: kept outside the image."""
    return Path(built.log_path[: -len(".log")] + ".env.json")


def _build_env(steps: list[engine.Step]) -> dict | None:
    for step in steps:
        for line in step.lines:
            if line.startswith(BUILD_ENV_MARK):
                return json.loads(line[len(BUILD_ENV_MARK):])
    return None


def reproducible(client, raw_id: str, rendered: RenderedBuild, steps: list[engine.Step]) -> normalize.Normalized:
    """Normalise the engine's image (builder/normalize.py) and load it under the SHA tag."""
    from builder import options, staging

    base_config, base_layers = staging.base_of(rendered.labels, options.registry_credentials())
    epoch = normalize.epoch_of(rendered.labels["org.opencontainers.image.created"])
    norm = normalize.normalize(client, raw_id, rendered.tag, base_config, base_layers, epoch)
    env = _build_env(steps)
    if env is not None and env != norm.build_env:
        norm.build_env = env
        normalize.save_record(norm)
    return norm


def build(rendered: RenderedBuild, pins=None, nocache: bool = False, client=None, echo: bool = True) -> BuiltImage:
    """Send the rendered context to the engine (network none), tag it with the sha tag, record it."""
    client = client or engine.connect()
    out_dir = Path(rendered.context_path).parent
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{time.time_ns() % 10**9:09d}"
    log_path = out_dir / f"build-{stamp}.log"
    with log.step(f"docker build {rendered.tag}"), open(rendered.context_path, "rb") as context:
        result = engine.build(client, context, rendered.tag, log_path, nocache=nocache, echo=echo)
    attrs = engine.inspect_image(client, result.image_id)
    if attrs is None:
        raise BuildFailed(f"{rendered.tag}: image {result.image_id} vanished after the build")
    check_labels(attrs, rendered.labels, rendered.tag)
    norm = reproducible(client, result.image_id, rendered, result.steps)
    attrs = engine.inspect_image(client, norm.image_id) or {}
    times = stage_times(rendered.dockerfile, result.steps, result.seconds)
    times["normalise"] = norm.seconds
    built = BuiltImage(
        image_id=norm.image_id, raw_image_id=result.image_id, manifest_digest=norm.manifest_digest,
        source_date=normalize.iso(norm.source_date_epoch), tags=sorted(attrs.get("RepoTags") or []), size=int(attrs.get("Size") or 0),
        created=str(attrs.get("Created", "")), engine_version=engine.engine_version(client),
        builder_version=BUILDER_VERSION, context_sha256=rendered.context_sha256,
        dockerfile_sha256=rendered.dockerfile_sha256,
        stage_times=times, log_path=result.log_path, cached=all_cached(result.steps))
    steps = [{"step": s.index, "instruction": s.instruction, "seconds": s.seconds, "cached": s.cached,
              "image": s.image} for s in result.steps]
    steps_file(built).write_text(json.dumps(steps, indent=2) + "\n")
    build_env_file(built).write_text(json.dumps(norm.build_env, indent=2) + "\n")
    (out_dir / "steps.json").write_text(json.dumps(steps, indent=2) + "\n")  # the latest build
    (out_dir / "built.json").write_text(built.model_dump_json(indent=2) + "\n")
    log.info(f"built {rendered.tag} {norm.image_id[:19]} manifest {norm.manifest_digest} ({built.size / 1e6:.0f} MB,"
             f" {result.seconds:.1f} s{', all cached' if built.cached else ''})")
    return built
