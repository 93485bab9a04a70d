"""Build timings of the demo image (prints figures; not a test).

1. cold build (nocache), 2. no-op rebuild (full cache hit, same image ID),
3. rebuild after changing only the verl pin (tinyrl PR #34 head): vllm and megatron layers reused.
4. reproducible image: normalisation (cold build) + our own push through the registry API, versus the
   engine's `docker push` of the same image to a fresh repository (both mount the base layers).
Targets: no-op under 3 s; verl-only change under 15% of the cold build.
usage: python benchmarks/bench_build.py
"""
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.engine import staging  # noqa: E402
from builder.core.options import Settings  # noqa: E402
from builder.engine import client as engine
from builder.image import build, dockerfile, render
from builder.pins import model as pins_mod  # noqa: E402
from builder.sources import resolve as sources
from demo.prepare import prepare_demo, variant_pins  # noqa: E402

SETTINGS = Settings.from_env()


def timed_build(pins_path, nocache=False):
    """Seconds for render + build (what `builder build` does after resolving)."""
    pins = pins_mod.load(pins_path)
    resolved = sources.resolve(pins, SETTINGS)
    start = time.monotonic()
    rendered = render.render(pins, resolved, SETTINGS)
    built = build.build(rendered, SETTINGS, nocache=nocache, echo=False)
    return time.monotonic() - start, built


def reused(built) -> dict:
    steps = json.loads(build.steps_file(built).read_text())
    groups = dockerfile.instructions((Path(built.log_path).parent / "Dockerfile").read_text())
    out = {}
    for step in steps:
        group = groups[step["step"] - 1][0]
        hits, total = out.get(group, (0, 0))
        out[group] = (hits + step["cached"], total + 1)
    return {g: f"{hits}/{total} cached" for g, (hits, total) in out.items()}


def push_times(built, base_name: str) -> tuple[float, float]:
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
    engine.remove_image(client, f"{repo}:x")
    return own, pushed


def main() -> int:
    pins_path = prepare_demo(SETTINGS)
    cold_s, cold = timed_build(pins_path, nocache=True)
    noop_s, noop = timed_build(pins_path)
    with tempfile.TemporaryDirectory() as tmp:
        verl_s, verl = timed_build(variant_pins(Path(tmp), "verl", 34, pins_path=pins_path))
    print(f"cold build (nocache):        {cold_s:7.2f} s  image {cold.image_id[:19]}  {cold.size / 1e6:.0f} MB")
    print(f"  stages: {cold.stage_times}")
    print(f"no-op rebuild:               {noop_s:7.2f} s  same image ID: {noop.image_id == cold.image_id},"
          f" all cached: {noop.cached}  (target < 3 s: {'ok' if noop_s < 3 else 'MISSED'})")
    ratio = verl_s / cold_s
    print(f"verl-only change (PR #34):   {verl_s:7.2f} s  = {ratio:.1%} of cold"
          f"  (target < 15%: {'ok' if ratio < 0.15 else 'MISSED'})")
    print(f"  layers: {reused(verl)}")
    print(f"  stages: {verl.stage_times}")
    own_s, engine_s = push_times(cold, pins_mod.load(pins_path).base.name)
    norm_s = cold.stage_times.get("normalise", 0.0)
    print(f"normalise + own push:        {norm_s + own_s:7.2f} s  (normalise {norm_s:.2f} s of a {cold_s:.2f} s"
          f" cold build, push {own_s:.2f} s)  vs engine push {engine_s:7.2f} s;"
          f" manifest {cold.manifest_digest[:19]}")
    client = engine.connect(SETTINGS)
    for tag in verl.tags:  # the variant is never accepted: leave no tag of it
        engine.remove_image(client, tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
