"""uv against pip as the resolver of `builder lock`, on the same closure, target and base constraints.

usage: python benchmarks/bench_lock_resolver.py PINS [--runs 2]
       python benchmarks/bench_lock_resolver.py --base IMAGE@sha256:... --requirements FILE [--runs 2]

With PINS: the runtime requirements of the three components (metadata prepared in the base, as
`builder lock` does). With --requirements: any requirement list (one per line) on a base image.
Each resolver runs `--runs` times (the first with its own cache cold only if that cache is empty);
prints seconds, package count and the packages where the two answers differ, as JSON.
pip must use --only-binary=:all: to resolve for a --platform other than the host's, so a closure
with an sdist-only package (antlr4-python3-runtime under hydra-core) is answered differently.
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.core.options import Settings  # noqa: E402
from builder.engine import basecontainer
from builder.lock import lockfile as lock
from builder.lock import resolver  # noqa: E402


def requirements_of_pins(settings: Settings, pins_path: str) -> tuple[list[str], dict[str, str], Any]:
    from builder.pins import model as pins_mod
    from builder.sources import resolve as sources

    pins = pins_mod.load(pins_path)
    resolved = sources.resolve(pins, settings, allow_moved_pr=True)
    base = basecontainer.read_base(settings, pins.base.image, pins.base.python_bin, pins.base.python, pins.base.platform)
    target = resolver.Target.of(base)
    comps = lock.gather(settings, pins, resolved, base, target, "uv")
    reqs = sorted({r for c in comps for r in c.requires_dist})
    return reqs, {**base.dists, **{c.distribution: c.version for c in comps}}, target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pins", nargs="?")
    parser.add_argument("--base", help="base image by digest (with --requirements)")
    parser.add_argument("--python-bin", default="/opt/venv/bin/python")
    parser.add_argument("--python", default="3.11")
    parser.add_argument("--platform", default="linux/amd64")
    parser.add_argument("--requirements", help="file with one requirement per line")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    if args.pins:
        reqs, provided, target = requirements_of_pins(settings, args.pins)
    else:
        base = basecontainer.read_base(settings, args.base, args.python_bin, args.python, args.platform)
        reqs = [ln.strip() for ln in Path(args.requirements).read_text().splitlines() if ln.strip()]
        provided, target = base.dists, resolver.Target.of(base)
    out: dict[str, Any] = {"requirements": len(reqs), "target": target.uv_platform()}
    answers = {}
    for name in resolver.RESOLVERS:
        times = []
        for _ in range(args.runs):
            seconds, found = resolver.timed_resolve(settings, reqs, provided, target, name)
            times.append(round(seconds, 2))
        answers[name] = found
        out[name] = {"seconds": times, "packages": len(found), "version": resolver.resolver_version(name)}
    uv, pip = answers["uv"], answers["pip"]
    out["differ"] = {n: [uv.get(n), pip.get(n)] for n in sorted(set(uv) | set(pip)) if uv.get(n) != pip.get(n)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
