"""The zero_update gate against `builder replay` of its bundle (prints figures as JSON; not a test).

Builds (layer cache) the demo image and the tinycore PR 23 variant (weight decay not scaled by lr: weights move
at lr 0), runs the zero_update gate on the variant (a fresh container, the whole recipe: 2 steps), writes the
report, then times `builder replay REPORT` as a user runs it (the CLI process, one fresh container, one step on
the captured batch) on the variant (differs: exit 1) and on the good image (equal: exit 0). `--repeats N`
runs the gate and each replay N times (medians). Target: the replay takes seconds where the gate takes minutes.
usage: python benchmarks/bench_replay.py [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.core.options import Settings  # noqa: E402
from builder.core.records import BuiltImage, ResolvedSources  # noqa: E402
from builder.image import build, render  # noqa: E402
from builder.lock import record as lock_record  # noqa: E402
from builder.pins import model as pins_mod  # noqa: E402
from builder.pins.model import Pins  # noqa: E402
from builder.report import document  # noqa: E402
from builder.runners import factory as runners  # noqa: E402
from builder.sources import resolve as sources  # noqa: E402
from demo.prepare import prepare_demo, variant_pins  # noqa: E402

SETTINGS = Settings.from_env()


def _build(pins_path: Path) -> tuple[Pins, ResolvedSources, BuiltImage]:
    pins = pins_mod.load(pins_path)
    resolved = sources.resolve(pins, SETTINGS)
    rendered = render.render(pins, lock_record.of(pins), resolved, SETTINGS)
    return pins, resolved, build.build(rendered, SETTINGS, echo=False)


def _replay(report_json: Path, image: str | None) -> tuple[float, int, str]:
    argv = [sys.executable, "-m", "builder", "replay", str(report_json), "--gate", "zero_update"]
    argv += ["--image", image] if image else []
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return round(time.monotonic() - start, 2), done.returncode, done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    local = prepare_demo(SETTINGS)
    pins, resolved, good = _build(local)
    with tempfile.TemporaryDirectory() as tmp:
        _, bad_resolved, bad = _build(variant_pins(Path(tmp) / "variant", "megatron", 23, pins_path=local))
        gate_runs = []
        for _ in range(args.repeats):  # the host is shared: every figure is a median of repeats
            start = time.monotonic()
            result = runners.gate_local_image(bad.image_id, pins, SETTINGS, gates=["zero_update"])
            gate_runs.append(round(time.monotonic() - start, 2))
        gate_s = statistics.median(gate_runs)
        gate = next(g for g in result.gates if g.name == "zero_update")
        out = Path(tmp) / "run"
        document.write(document.make_report(pins, lock_record.of(pins), bad_resolved, bad, result), out)
        report_json = out / "report.json"
        bundle_bytes = (out / "replay" / "zero_update.json").stat().st_size
        same = [_replay(report_json, None) for _ in range(args.repeats)]
        fixed = [_replay(report_json, good.image_id) for _ in range(args.repeats)]
    same_median, fixed_median = statistics.median(s for s, _, _ in same), statistics.median(s for s, _, _ in fixed)
    figures: dict[str, Any] = {
        "gate": {"status": gate.status, "reason": gate.reason, "seconds": gate_runs, "median": gate_s,
                 "in_container_seconds": gate.evidence.seconds},
        "bundle_bytes": bundle_bytes,
        "replay_same_image": {"seconds": [s for s, _, _ in same], "median": same_median,
                              "exit_codes": [c for _, c, _ in same], "output": same[0][2]},
        "replay_good_image": {"seconds": [s for s, _, _ in fixed], "median": fixed_median,
                              "exit_codes": [c for _, c, _ in fixed], "output": fixed[0][2]},
    }
    figures["gate_over_replay"] = round(gate_s / same_median, 1)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
