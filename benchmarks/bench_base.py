"""Time the demo base image build per phase (prints a table; not a test).

usage: python benchmarks/bench_base.py [--cold-rootfs]
Builds under a repository name of its own (127.0.0.1:5000/bench/base-<pid>) and, with the default, reuses
the debootstrap rootfs image already in the engine (pass --cold-rootfs to debootstrap again, into a rootfs
repository of its own). The wheels come from BUILDER_CACHE unless --cache names another (then they are
downloaded too). Prints each phase of `python -m demo base` and removes its local tags afterwards.
"""
import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.core import log  # noqa: E402
from builder.core.options import Settings  # noqa: E402
from builder.engine import client as engine  # noqa: E402
from builder.engine import infra  # noqa: E402
from demo import baseimage  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold-rootfs", action="store_true")
    ap.add_argument("--cache", type=Path)
    args = ap.parse_args()
    settings = Settings.from_env()
    if args.cache:
        settings = dataclasses.replace(settings, cache_root=args.cache.resolve())
    stamp = f"{os.getpid()}-{time.time_ns() % 10**6}"
    baseimage.REPOSITORY = f"{infra.registry_url()}/bench/base-{stamp}"
    if args.cold_rootfs:
        baseimage.ROOTFS_REPOSITORY = f"bench-rootfs-{stamp}"
    start = time.monotonic()
    ref = baseimage.ensure_base_image(settings, force=True)
    total = time.monotonic() - start
    client = engine.connect(settings)
    image = client.images.get(ref)
    size = image.attrs.get("Size", 0)
    for tag in image.tags:
        if tag.startswith(baseimage.REPOSITORY):
            engine.remove_image(client, tag)
    print(f"\ndemo base image ({size / 1e9:.2f} GB, load {os.getloadavg()[0]:.1f}; rootfs"
          f" {'debootstrapped' if args.cold_rootfs else 'reused'})")
    logfile = settings.cache("logs") / f"base-build-{baseimage.recipe_hash(settings)[:16]}.log"
    text = logfile.read_text(errors="replace")
    run = text[text.rfind("@@phase venv"):]  # this run's INSTALL phases (the log is appended to)
    marks = [(line.split()[1], float(line.split()[2])) for line in run.splitlines() if line.startswith("@@phase ")]
    phases = {f"base: venv: {a}": round(t1 - t0, 3) for (a, t0), (_, t1) in zip(marks, marks[1:])}
    for name, seconds in {**log.timings, **phases}.items():
        if name.startswith("base:"):
            print(f"  {name:<48} {seconds:7.1f} s")
    print(f"  {'total':<48} {total:7.1f} s")
    print(json.dumps({k: v for k, v in log.timings.items() if k.startswith("base:")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
