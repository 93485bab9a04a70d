"""Independence from the base's size: the demo pins on synthetic bases of 1 GB and 8 GB (incompressible
files added to the demo base), then a verl-only rebuild timed end to end per stage (render, engine
build, normalise, stage push, pull, promote). Target: 8 GB adds at most 10% over 1 GB.

Each base is built here (network none), pushed to the local registry, and removed again at the end
with every image built on it (only images holding this run's random ballast layer). Registry blobs stay
until the registry's garbage collection (never run here: the registry is shared).
usage: python benchmarks/bench_base_size.py [GB ...]   (default: 1 8)
"""
import io
import json
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.core.options import Settings  # noqa: E402
from builder.core.records import BuiltImage  # noqa: E402
from builder.engine import client as engine  # noqa: E402
from builder.engine import staging  # noqa: E402
from builder.engine.client import Client  # noqa: E402
from builder.image import build, render  # noqa: E402
from builder.lock import record as lock_record
from builder.pins import model as pins_mod  # noqa: E402
from builder.release import promote  # noqa: E402
from builder.sources import resolve as sources  # noqa: E402
from demo.prepare import LOCAL_PINS, prepare_demo, variant_pins  # noqa: E402

SETTINGS = Settings.from_env()
REGISTRY = "127.0.0.1:5000"
PREFIX = f"{REGISTRY}/i20a-bench"
PRS = (34, 35)  # verl-only changes: the heads of two demo PRs (the demo pins hold #33's)
ROUNDS = 4  # each PR rebuilt this often per base (its new layers removed in between), rounds interleaved
STAGES = ("render", "engine build", "normalise", "stage push", "pull", "promote", "total")


def synthetic_base(client: Client, demo_base: str, gigabytes: int) -> tuple[str, str]:
    """FROM the demo base, `gigabytes` files of 1 GB from /dev/urandom; pushed; (name@digest, ballast diff ID)."""
    dockerfile = (f"FROM {demo_base}\nRUN mkdir /opt/ballast && for i in $(seq {gigabytes}); do "
                  "head -c 1073741824 /dev/urandom > /opt/ballast/$i; done\n")
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    context.seek(0)
    repo = f"{PREFIX}/base-{gigabytes}g"
    for item in client.api.build(fileobj=context, custom_context=True, tag=f"{repo}:latest", network_mode="none",
                                 rm=True, forcerm=True, decode=True):
        if "error" in item:
            raise RuntimeError(item["error"])
    for item in client.api.push(repo, tag="latest", stream=True, decode=True):
        if "error" in item:
            raise RuntimeError(item["error"])
    attrs = client.api.inspect_image(f"{repo}:latest")
    digest = next(d for d in attrs["RepoDigests"] if d.startswith(repo + "@")).partition("@")[2]
    return f"{repo}@{digest}", attrs["RootFS"]["Layers"][-1]


def pins_on(base_ref: str, gigabytes: int, out: Path, pins_path: Path, component: str | None = None,
            pr: int | None = None) -> Path:
    def edit(data: dict[str, Any]) -> None:
        data["base"]["image"] = base_ref
        data["name"] = f"i20a-bench-{gigabytes}g"
        data["image"]["repository"] = f"{PREFIX}/unified-{gigabytes}g"
        data["image"].pop("staging", None)
        data["image"]["tags"] = []
    return variant_pins(out, component, pr, edit=edit, pins_path=pins_path)


def end_to_end(pins_path: Path, client: Client) -> tuple[dict[str, float], BuiltImage]:
    """One build as `builder run` does it, then stage push, pull by digest and promote."""
    times: dict[str, float] = {}
    pins = pins_mod.load(pins_path)
    resolved = sources.resolve(pins, SETTINGS)
    start = mark = time.monotonic()
    rendered = render.render(pins, lock_record.of(pins), resolved, SETTINGS)
    times["render"] = time.monotonic() - mark
    mark = time.monotonic()
    built = build.build(rendered, SETTINGS, echo=False)
    whole = time.monotonic() - mark
    times["normalise"] = built.stage_times["normalise"]
    times["engine build"] = whole - times["normalise"]
    staging_repo = staging.staging_repository(pins.image.repository)
    mark = time.monotonic()
    ref = staging.push(built.manifest_digest, staging_repo, pins.base.name, SETTINGS)
    times["stage push"] = time.monotonic() - mark
    mark = time.monotonic()
    staging.pull(client, str(ref), built.image_id, SETTINGS)
    times["pull"] = time.monotonic() - mark
    mark = time.monotonic()
    promote.promote(str(ref), built.image_id, pins.image.repository, ["bench"], SETTINGS)
    times["promote"] = time.monotonic() - mark
    times["total"] = time.monotonic() - start
    return times, built


def forget(client: Client, built: BuiltImage) -> None:
    """Remove what this build made (its normalised and raw images, the images of the steps that did not
    come from the cache), so the next rebuild of the same pins is a real one."""
    steps = json.loads(build.steps_file(built).read_text())
    for ref in [built.image_id, built.raw_image_id] + [s["image"] for s in reversed(steps) if not s["cached"]]:
        try:
            client.api.remove_image(ref, force=True)
        except Exception:  # noqa: BLE001 (gone with a child already)
            pass


def _exists(client: Client, image_id: str) -> bool:
    try:
        client.api.inspect_image(image_id)
        return True
    except Exception:  # noqa: BLE001 (ImageNotFound)
        return False


def cleanup(client: Client, ballast: str) -> int:
    """Remove every image holding this run's ballast layer (children first), and nothing else."""
    mine = []
    for image in client.api.images(all=True):
        try:
            layers = client.api.inspect_image(image["Id"])["RootFS"]["Layers"]
        except Exception:  # noqa: BLE001 (removed meanwhile)
            continue
        if ballast in layers:
            mine.append((len(layers), image["Id"], image.get("RepoTags") or []))
    for _, image_id, tags in mine:
        for tag in tags:
            if tag != "<none>:<none>":
                client.api.remove_image(tag, noprune=True)
    left = [image_id for _, image_id, _ in mine]
    while left:  # children first; a child may hold no more layers than its parent (LABEL), so retry
        failed = []
        for image_id in left:
            try:
                client.api.remove_image(image_id, force=True, noprune=True)
            except Exception:  # noqa: BLE001 (a child still there, or gone already)
                if client.api.images(all=True, quiet=True) and _exists(client, image_id):
                    failed.append(image_id)
        if len(failed) == len(left):
            raise RuntimeError(f"could not remove {len(failed)} images holding the ballast: {failed[:3]}")
        left = failed
    return len(mine)


def main(sizes: list[int]) -> int:
    demo_pins = LOCAL_PINS if LOCAL_PINS.exists() else prepare_demo(SETTINGS)
    demo_base = pins_mod.load(demo_pins).base.image
    client = engine.connect(SETTINGS)
    runs: dict[int, list[dict[str, float]]] = {g: [] for g in sizes}
    extra: dict[int, list[str]] = {g: [] for g in sizes}
    bases: dict[int, tuple[str, str]] = {}
    work = Path(tempfile.mkdtemp(prefix="i20a-bench-"))
    try:
        for gigabytes in sizes:  # every base first, then the rebuilds interleaved (the machine's load drifts)
            mark = time.monotonic()
            bases[gigabytes] = synthetic_base(client, demo_base, gigabytes)
            made = time.monotonic() - mark
            cold, _ = end_to_end(pins_on(bases[gigabytes][0], gigabytes, work / f"{gigabytes}-main", demo_pins), client)
            extra[gigabytes].append(f"base {bases[gigabytes][0].rpartition('@')[2][:19]} made+pushed in {made:.0f} s;"
                                    f" cold build+stage {cold['total']:.1f} s")
        for _ in range(ROUNDS):
            for pr in PRS:
                for gigabytes in sizes:
                    pins = pins_on(bases[gigabytes][0], gigabytes, work / f"{gigabytes}-{pr}", demo_pins, "verl", pr)
                    times, built = end_to_end(pins, client)
                    runs[gigabytes].append(times)
                    extra[gigabytes].append(f"verl #{pr}: engine {built.stage_times['total']:.1f} s (verl"
                                            f" {built.stage_times['verl']:.1f}, runtime {built.stage_times['runtime']:.1f})")
                    forget(client, built)
    finally:
        for gigabytes, (_, ballast) in bases.items():
            removed = cleanup(client, ballast)
            print(f"[{gigabytes} GB] removed {removed} images holding the ballast layer", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    rows = {g: {stage: statistics.median(r[stage] for r in runs[g]) for stage in STAGES} for g in sizes}
    best = {g: {stage: min(r[stage] for r in runs[g]) for stage in STAGES} for g in sizes}
    print(f"verl-only rebuild, end to end (seconds; median and minimum of {ROUNDS * len(PRS)}: verl PRs"
          f" {', '.join(f'#{p}' for p in PRS)}, {ROUNDS} rounds interleaved across the bases; the minimum is the"
          " least disturbed by other jobs on the machine)")
    print(f"| stage | {' | '.join(f'{g} GB median | {g} GB min' for g in sizes)} |")
    print(f"|---|{'---|---|' * len(sizes)}")
    for stage in STAGES:
        print(f"| {stage} | {' | '.join(f'{rows[g][stage]:.2f} | {best[g][stage]:.2f}' for g in sizes)} |")
    for g in sizes:
        print(f"{g} GB: " + "; ".join(extra[g]))
        print(f"{g} GB totals: " + ", ".join(f"{r['total']:.1f}" for r in runs[g]))
    if len(sizes) >= 2:
        for what, table in (("median", rows), ("minimum", best)):
            grow = table[sizes[-1]]["total"] / table[sizes[0]]["total"] - 1
            ours = sum(table[sizes[-1]][s] - table[sizes[0]][s] for s in ("normalise", "stage push", "pull", "promote"))
            print(f"{sizes[-1]} GB vs {sizes[0]} GB ({what}): {grow:+.1%} (target <= +10%: {'ok' if grow <= 0.10 else 'MISSED'});"
                  f" normalise + stage push + pull + promote {ours:+.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]] or [1, 8]))
