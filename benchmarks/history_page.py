"""365 nights of history: the history page's render time and size (targets: under 1 s, under 2 MB). Prints JSON.

The nights are derived from one real report.json as tests/history_nights.py derives the demo nights (real Report
records written with report.document.write, a nightly-diff.json each, a row each in a real SQLite history): a new
vllm commit every night, the slow PR failing performance two nights in every 30, the zero_update defect three
nights in every 45, one night in 20 with its report removed as `builder gc` leaves it.
Measured: the render in this process from the rows to the written file, with the facts of each report read from
the reports (cold: no page-cache.json) and from the cache (warm: the nightly's case, where each night added one
report); a fresh `builder history` process (Python, imports and render); the page's bytes.
usage: python benchmarks/history_page.py [REPORT] [--nights 365] [--work DIR]
REPORT: a run's report.json (default: the newest under $BUILDER_CACHE/runs)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.core.options import Settings  # noqa: E402
from builder.nightly import page  # noqa: E402
from builder.nightly.history import History  # noqa: E402
from builder.pipeline import nightly_runs  # noqa: E402
from builder.report import document  # noqa: E402
from tests.history_nights import SLOW_REASON, ZERO_REASON, Plan, write_nights  # noqa: E402


def plans(count: int) -> list[Plan]:
    out = []
    for night in range(count):
        commit = f"{night:040x}"
        if night % 30 in (10, 11):
            out.append(Plan(commit, {"performance": SLOW_REASON}, slow=12.0))
        elif night % 45 in (20, 21, 22):
            out.append(Plan(commit, {"zero_update": ZERO_REASON}))
        else:
            out.append(Plan(commit))
    return out


def newest_report(settings: Settings) -> Path:
    found = sorted(settings.cache_root.glob("runs/*/report.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no report.json under {settings.cache_root}/runs: run `make demo` first or name one")
    return found[-1]


def timed_render(history: History, settings: Settings, out: Path, nights: int) -> float:
    started = time.perf_counter()
    nightly_runs.history_page(settings, last=nights, out=out, history=history)
    return round(time.perf_counter() - started, 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("report", nargs="?", type=Path)
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    settings = Settings.from_env()
    source = args.report or newest_report(settings)
    work = args.work or Path(tempfile.mkdtemp(prefix="history-page-"))
    local = replace(settings, cache_root=work / "cache")
    history = History(local.cache_root / "history" / "runs.sqlite")
    started = time.perf_counter()
    paths = write_nights(document.load(source), plans(args.nights), work / "runs", history)
    written = time.perf_counter() - started
    for gone in paths[5::20]:
        gone.unlink()
    out = work / "history.html"
    cold = timed_render(history, local, out, args.nights)  # the facts of every report read and cached
    warm = [timed_render(history, local, out, args.nights) for _ in range(3)]
    env = {**os.environ, "BUILDER_CACHE": str(local.cache_root)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "builder", "history", "--html", str(out), "--last", str(args.nights)],
                   check=True, env=env, capture_output=True)
    process = time.perf_counter() - started
    print(json.dumps({
        "nights": args.nights, "from": str(source), "report_bytes": source.stat().st_size,
        "write_nights_s": round(written, 1), "render_cold_s": cold, "render_warm_s": sorted(warm)[1],
        "builder_history_process_s": round(process, 3), "page_bytes": out.stat().st_size,
        "page_cache_bytes": (history.path.parent / page.CACHE).stat().st_size,
        "targets": {"render_s": 1.0, "page_bytes": 2_000_000}, "work": str(work)}, indent=2))


if __name__ == "__main__":
    main()
