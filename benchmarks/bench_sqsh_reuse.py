"""The .sqsh export of an image whose base was exported before, against a cold export: seconds per step, the
ratio of the totals (goal: warm at most 25% of cold), and the sha256 of both (they must be equal).

    python benchmarks/bench_sqsh_reuse.py RUN/report.json [--options '-comp lzo -noD'] [--no-smoke]

Both exports run in a temporary cache (nothing kept before the cold one); the export index is emptied between
them, so the second is no cache hit of the image ID but starts from the base tree the first one kept. The report
is copied first: the one given is not changed. The build's blob store (`<cache>/oci`) is linked in, as in the
run that built the image (the warm export reads the layers above the kept tree from there); `--no-store` leaves it
out (then the warm export runs `docker save`).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.core import files as fs  # noqa: E402
from builder.core.options import Settings  # noqa: E402
from builder.release import sqsh, trust  # noqa: E402
from builder.report import document  # noqa: E402
from builder.runners import sqsh_smoke  # noqa: E402


def export(report_json: Path, settings: Settings, out: Path, options: str | None, smoke: bool) -> tuple[float, dict[str, float]]:
    report = document.load(report_json)
    checked = trust.check(report, str(report_json))
    pins = checked[0] if checked else None
    start = time.monotonic()
    record = sqsh.export(report, report_json, pins, settings, out=out, squash_options=options,
                         smoke=sqsh_smoke.provenance_on_rootfs if smoke else None)
    return time.monotonic() - start, record.seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("report", type=Path)
    ap.add_argument("--options", help="mksquashfs options (default: the settings')")
    ap.add_argument("--no-smoke", action="store_true", help="leave the provenance smoke out of both")
    ap.add_argument("--no-store", action="store_true", help="no build blob store: the warm export uses docker save")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sqsh-reuse-", dir=os.environ.get("BUILDER_CACHE")))
    try:
        shutil.copytree(args.report.parent, work / "run", ignore=shutil.ignore_patterns("*.sqsh", "*.sqsh.sha256"))
        settings = Settings.from_env({**os.environ, "BUILDER_CACHE": str(work / "cache")})
        built_in = Settings.from_env().cache_root / "oci"  # the build's blob store, as in the run that built it
        if built_in.is_dir() and not args.no_store:
            (work / "cache").mkdir(exist_ok=True)
            (work / "cache" / "oci").symlink_to(built_in)
        report_json = work / "run" / args.report.name
        rows = {}
        for name in ("cold", "warm"):
            shutil.rmtree(settings.cache("sqsh", "exports"))  # no hit by image ID: the export itself runs
            rows[name] = export(report_json, settings, work / f"{name}.sqsh", args.options, not args.no_smoke)
        cold, warm = rows["cold"], rows["warm"]
        print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {(work / 'cold.sqsh').stat().st_size / 1e6:.0f} MB")
        print(f"{'step':<28}{'cold s':>9}{'warm s':>9}")
        for step in dict.fromkeys([*cold[1], *warm[1]]):
            print(f"{step:<28}{cold[1].get(step, 0.0):>9.1f}{warm[1].get(step, 0.0):>9.1f}")
        print(f"{'total':<28}{cold[0]:>9.1f}{warm[0]:>9.1f}  warm/cold {warm[0] / cold[0]:.2f}")
        same = fs.sha256_file(work / "cold.sqsh") == fs.sha256_file(work / "warm.sqsh")
        print(f"sha256 {'equal' if same else 'DIFFERENT'}: {fs.sha256_file(work / 'warm.sqsh')}")
        if not same:
            sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
