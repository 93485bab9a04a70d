"""`python -m demo [run|prepare|base]`: the demo world and the whole flow on it.

- prepare: engine + registry, base image, demo repositories, pins/demo.local.yaml; prints its path
- base:    only the demo base image; prints its digest reference
- run:     prepare, then `builder run pins/demo.local.yaml --publish` (the default); `run --slurm`: the gates
           on the two-node Slurm cluster of demo/cluster.py (started here if not running), from the .sqsh
"""
from __future__ import annotations

import sys
import time

from builder import cli
from builder.core import log
from builder.core.errors import BuilderError
from builder.core.options import Settings
from builder.core.safetext import fit

# the phases `make demo` prints at the end, in order (log.step names; absent ones are left out)
PHASES = ("demo: engine + registry", "demo: base image", "demo: stack repositories", "load pins", "resolve sources",
          "render", "build", "acceptance", "publish", "export .sqsh")


def phase_table(started: float, setup_s: float | None) -> str:
    rows = [("make setup (venv, engine, registry)", setup_s)] if setup_s is not None else []
    rows += [(name, log.timings[name]) for name in PHASES if name in log.timings]
    total = time.monotonic() - started + (setup_s or 0.0)
    lines = [f"  {name:<40} {seconds:7.1f} s" for name, seconds in rows if seconds is not None]
    return "\n".join(["== make demo phase timings ==", *lines, f"  {'total':<40} {total:7.1f} s"])


def main(argv: list[str]) -> int:
    started = time.monotonic()
    setup_s = None
    if "--setup-seconds" in argv:  # `make demo` passes how long `make setup` took
        at = argv.index("--setup-seconds")
        setup_s = float(argv[at + 1])
        argv = argv[:at] + argv[at + 2:]
    try:
        return _main(argv)
    finally:
        if (argv[0] if argv else "run") == "run":
            log.info(phase_table(started, setup_s))


def _main(argv: list[str]) -> int:
    slurm = "--slurm" in argv
    argv = [a for a in argv if a != "--slurm"]
    command = argv[0] if argv else "run"
    if command not in ("run", "prepare", "base"):
        print(f"error: expected run, prepare or base, got {command[:40]!r}; see `python -m demo --help`"
              if command not in ("-h", "--help") else __doc__, file=sys.stderr)
        return 0 if command in ("-h", "--help") else 2
    from demo import baseimage, prepare

    try:
        settings = Settings.from_env()
        if command == "base":
            print(baseimage.ensure_base_image(settings))
            return 0
        with log.step("prepare demo world"):
            pins = prepare.prepare_demo(settings)
    except BuilderError as err:
        print(fit(f"error: {err}"), file=sys.stderr)
        return err.exit_code
    if command == "prepare":
        print(pins)
        return 0
    if slurm:
        import os

        from demo import cluster

        try:  # installs what is missing (apt-get); a missing piece is one line saying what to do, never a traceback
            with log.step("demo: slurm cluster"):
                found = cluster.start(settings=settings)
                os.environ["SLURM_CONF"] = str(found.conf)  # this process and its children
            pins = prepare.cluster_pins(pins, found.local_pattern())
        except BuilderError as err:
            print(fit(f"error: {err}"), file=sys.stderr)
            return err.exit_code
    return cli.run(["run", str(pins), "--publish", "--key", str(prepare.signing_key(settings)),
                    *(["--slurm"] if slurm else [])])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
