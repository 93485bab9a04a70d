"""Build timings of the demo image (prints figures; not a test).

1. cold build (nocache): the engine's time, then normalisation (through the registry: the engine pushes
   only the layers the registry lacks, only added layers are downloaded) as a share of the engine's time;
2. the same raw image normalised by `docker save` (the whole image, base included) into an empty store,
   and through the registry into an empty store: both must give the same manifest digest;
3. no-op rebuild (full cache hit, same digest); 4. verl-only change (tinyrl PR #34 head) as a share of
   the cold build, with the layers reused; 5. export-sqsh of an already exported image ID (--report);
6. our push of the normalised image versus the engine's `docker push` of the raw one.
Targets: normalisation <= 10% of the engine's build; no-op <= 3 s with the same digest; verl-only
<= 15% of cold; an export of an exported digest is a cache hit.
usage: python benchmarks/bench_build.py [--report ACCEPTED_REPORT.json]
"""
import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.core.options import Settings  # noqa: E402
from builder.core.records import BuiltImage, RenderedBuild  # noqa: E402
from builder.engine import client as engine  # noqa: E402
from builder.engine import normalize, staging  # noqa: E402
from builder.image import build, dockerfile, render  # noqa: E402
from builder.lock import record as lock_record
from builder.pins import model as pins_mod  # noqa: E402
from builder.pipeline import releasing  # noqa: E402
from builder.sources import resolve as sources  # noqa: E402
from demo.prepare import LOCAL_PINS, prepare_demo, variant_pins  # noqa: E402

SETTINGS = Settings.from_env()


def ok(good: bool) -> str:
    return "ok" if good else "MISSED"


def timed_build(pins_path: Path, nocache: bool = False) -> tuple[float, BuiltImage, RenderedBuild]:
    """Seconds for render + build (what `builder build` does after resolving)."""
    pins = pins_mod.load(pins_path)
    resolved = sources.resolve(pins, SETTINGS)
    start = time.monotonic()
    rendered = render.render(pins, lock_record.of(pins), resolved, SETTINGS)
    built = build.build(rendered, SETTINGS, nocache=nocache, echo=False)
    return time.monotonic() - start, built, rendered


def reused(built: BuiltImage) -> dict[str, Any]:
    steps = json.loads(build.steps_file(built).read_text())
    groups = dockerfile.instructions((Path(built.log_path).parent / "Dockerfile").read_text())
    out: dict[str, tuple[int, int]] = {}
    for step in steps:
        group = groups[step["step"] - 1][0]
        hits, total = out.get(group, (0, 0))
        out[group] = (hits + step["cached"], total + 1)
    return {g: f"{hits}/{total} cached" for g, (hits, total) in out.items()}


def normalise_ways(built: BuiltImage, rendered: RenderedBuild) -> list[tuple[str, float, str, dict[str, Any]]]:
    """The cold build's raw image normalised again into an empty store, by each source."""
    client = engine.connect(SETTINGS)
    base_config, base_layers = staging.base_of(rendered.labels, SETTINGS)
    host = rendered.labels[staging.BASE_NAME].partition("/")[0]
    rows = []
    for source in ("save", "registry"):
        with tempfile.TemporaryDirectory(dir=SETTINGS.cache("oci", "tmp")) as tmp:
            empty = dataclasses.replace(SETTINGS, cache_root=Path(tmp))
            tag = f"127.0.0.1:5000/bench/normalise:{source}-{time.time_ns()}"
            start = time.monotonic()
            norm = normalize.normalize(client, built.raw_image_id, tag, base_config, base_layers,
                                       rendered.layer_epochs, empty, registry_host=host, source=source)
            rows.append((source, time.monotonic() - start, norm.manifest_digest, norm.times))
            engine.remove_image(client, tag)
    return rows


def push_times(built: BuiltImage, base_name: str) -> tuple[float, float]:
    """Seconds of our push (blobs + manifest by digest) and of the engine's own push of the image it built
    (it compresses the added layers itself), each to a new repository; both mount the base layers."""
    stamp = time.time_ns()
    start = time.monotonic()
    staging.push(built.manifest_digest, f"127.0.0.1:5000/bench/own-{stamp}", base_name, SETTINGS)
    own = time.monotonic() - start
    client = engine.connect(SETTINGS)
    repo = f"127.0.0.1:5000/bench/engine-{stamp}"
    engine.tag_image(client, built.raw_image_id, f"{repo}:x")
    start = time.monotonic()
    for item in client.api.push(repo, tag="x", stream=True, decode=True):
        if "error" in item:
            raise RuntimeError(item["error"])
    pushed = time.monotonic() - start
    client.api.remove_image(f"{repo}:x", noprune=True)
    return own, pushed


def sqsh_hit(report_path: Path) -> str:
    """Export the report's image twice (a copy of the report in a temp dir): the second is a cache hit."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "report.json"
        shutil.copy(report_path, copy)
        start = time.monotonic()
        first = releasing.export_sqsh(copy, SETTINGS, out=Path(tmp) / "first.sqsh")
        first_s = time.monotonic() - start
        start = time.monotonic()
        second = releasing.export_sqsh(copy, SETTINGS, out=Path(tmp) / "second.sqsh")
        second_s = time.monotonic() - start
    hit = "cache hit" in second.seconds and second.sha256 == first.sha256
    return (f"export-sqsh {first.image_id[:19]}: first {first_s:.2f} s ({'hit' if 'cache hit' in first.seconds else 'made'}),"
            f" again {second_s:.2f} s, cache hit with the same sha256: {hit}  (target: hit: {ok(hit)})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", type=Path, help="an ACCEPTED report of the demo image (export-sqsh cache hit)")
    args = ap.parse_args()
    pins_path = LOCAL_PINS if LOCAL_PINS.exists() else prepare_demo(SETTINGS)
    cold_s, cold, cold_rendered = timed_build(pins_path, nocache=True)
    noop_s, noop, _ = timed_build(pins_path)
    with tempfile.TemporaryDirectory() as tmp:
        verl_s, verl, _ = timed_build(variant_pins(Path(tmp), "verl", 34, pins_path=pins_path))
    engine_s, norm_s = cold.stage_times["total"], cold.stage_times["normalise"]
    print(f"cold build (nocache):        {cold_s:7.2f} s  image {cold.image_id[:19]}  {cold.size / 1e6:.0f} MB")
    print(f"  stages: {cold.stage_times}")
    print(f"  normalise {norm_s:.2f} s = {norm_s / engine_s:.1%} of the engine's {engine_s:.2f} s build"
          f"  (target <= 10%: {ok(norm_s <= 0.10 * engine_s)})")
    ways = normalise_ways(cold, cold_rendered)
    same = len({digest for _, _, digest, _ in ways} | {cold.manifest_digest}) == 1
    for source, seconds, digest, times in ways:
        print(f"  normalise by {source:8s} into an empty store: {seconds:6.2f} s  {times}  manifest {digest[:19]}")
    print(f"  both ways give the build's manifest digest: {same}")
    print(f"no-op rebuild:               {noop_s:7.2f} s  same digest: {noop.manifest_digest == cold.manifest_digest},"
          f" all cached: {noop.cached}  (target <= 3 s: {ok(noop_s <= 3 and noop.image_id == cold.image_id)})")
    ratio = verl_s / cold_s
    print(f"verl-only change (PR #34):   {verl_s:7.2f} s  = {ratio:.1%} of cold  (target <= 15%: {ok(ratio <= 0.15)})")
    print(f"  layers: {reused(verl)}")
    print(f"  stages: {verl.stage_times}")
    if args.report:
        print(sqsh_hit(args.report))
    if engine.inspect_image(engine.connect(SETTINGS), cold.raw_image_id) is not None:
        own_s, engine_push_s = push_times(cold, pins_mod.load(pins_path).base.name)
        print(f"own push of the normalised image {own_s:.2f} s vs engine push of the raw one {engine_push_s:.2f} s")
    client = engine.connect(SETTINGS)
    for tag in verl.tags:  # the variant is never accepted: leave no tag of it
        engine.remove_image(client, tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
