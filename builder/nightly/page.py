"""The nightly history as one self-contained HTML page (`builder history`; `builder nightly` writes it next to
its rows): per night the three PR heads, the digest and tags, the verdict, each gate's status, reason and
failure class (new, recurring or fixed since the previous night), the regression flags, the `.sqsh` and the
runner; trends over the nights; and the comparison of the newest night with the last accepted one before it.

The charts are matplotlib figures inlined as SVG: no script, no network, readable from `file://`. A failing
night is a red square in the strip at the top, a red band across every chart and a red row; a night flagged
for a regression is orange. A row whose report file is gone (`builder gc`) keeps what its history row says
and reads "report gone". What the page takes from each report is kept in `page-cache.json` beside the history
(keyed by the report file's size and mtime), so a page of 365 nights reads 365 reports once, not per render.
Each section's charts are kept in `page-charts/` beside it, under the sha256 of what they draw: a render (every
nightly writes the page of every name) draws only the sections whose nights changed.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import files as fs
from builder.core import log
from builder.core.constants import GATES
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import Evidence, Report, number
from builder.nightly import compare as compare_mod
from builder.nightly.history import History, Run
from builder.report import document
from builder.report import html as html_mod

FAILING = html_mod.FAILING
STAGES = ("resolve", "lock", "build", "normalise", "export")
TIMINGS = "timings.json"  # the run's step seconds (core/log.py timings), written beside the report by `nightly`
DIFF = "nightly-diff.json"
CACHE = "page-cache.json"
CACHE_FORMAT = 2
CHARTS = "page-charts"  # each section's SVG under the sha256 of what it draws (ChartCache)
CHART_FORMAT = 1  # part of that key: a change to how charts() draws makes every stored chart a miss
PAGE = "history.html"
BISECT = "bisect"  # `nightly --bisect`: the bisect directory beside a red night's report
DEFAULT_LAST = 365
MARKERS_UP_TO = 90  # nights: beyond this the lines carry no per-night marker (the SVG stays small)
REASON_CHARS = 300



def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stage_seconds(report: Report, timings: dict[str, Any]) -> dict[str, float | None]:
    """Resolve and lock from the run's step timings, build and normalise from the build record, export from
    the .sqsh record (None: not recorded, e.g. no lock step in a nightly, no export)."""
    b = report.build.stage_times if report.build else {}
    lock = [v for k, v in timings.items() if k.startswith("lock") and number(v) is not None]
    export = [v for k, v in (report.sqsh.seconds if report.sqsh else {}).items() if k not in ("mtime", "reused layers")]
    return {"resolve": number(timings.get("resolve sources")), "lock": sum(lock) if lock else None,
            "build": number(b.get("total")) or number(timings.get("build")),
            "normalise": number(b.get("normalise")), "export": sum(export) if export else None}


def report_facts(report: Report, run_dir: Path) -> dict[str, Any]:
    """What the page shows of one run's report (JSON-able: it is cached)."""
    diff = _json(run_dir / DIFF)
    tp = report.acceptance.throughput if report.acceptance else {}
    where = html_mod.runner(report)
    gate_facts = html_mod.container(report).gates
    control = next((g for g in report.gates if g.name == "control"), None)
    perf = next((g.evidence for g in report.gates if g.name == "performance"), Evidence())
    pulled = report.acceptance.pulled if report.acceptance else None
    tags = list(report.publish.tags if report.publish else report.tags)
    tags += [t for t in ((diff.get("tags") or {}).get("added") or []) if t not in tags]
    return {
        "components": [{"name": n, "pr": c.pr, "url": c.url, "commit": c.commit}
                       for n, c in report.sources.components.items()],
        "image_id": report.image_id, "tags": tags,
        "digest": report.publish.digest if report.publish else (pulled.digest if pulled else None),
        "published": report.publish is not None,
        "gates": [{"name": g.name, "status": g.status, "reason": g.reason[:REASON_CHARS],
                   "required": g.name in report.required_gates, "seconds": html_mod.gate_seconds(g, gate_facts)}
                  for g in report.gates],
        "reasons": [r[:REASON_CHARS] for r in report.reasons],
        "regression": [str(r)[:REASON_CHARS] for r in (diff.get("regression") or {}).get("reasons") or []],
        "sqsh": report.sqsh.sha256 if report.sqsh else where["sqsh_sha256"],
        "sqsh_size": report.sqsh.size if report.sqsh else None,
        "runner": where,
        "ratio": number(tp.get("ratio")) or perf.ratio,
        "min_ratio": number(tp.get("min_ratio")) or perf.min_ratio,
        "control_diff": compare_mod.diff_max(control.evidence) if control else None,
        "image_size": report.build.size if report.build else None,
        "stages": stage_seconds(report, _json(run_dir / TIMINGS)),
    }


class FactsCache:
    """page-cache.json beside the history: each report's facts under (size, mtime_ns) of its file."""

    def __init__(self, path: Path):
        self.path = path
        data = _json(path)
        self.entries: dict[str, Any] = data.get("entries", {}) if data.get("format") == CACHE_FORMAT else {}
        self.changed = False

    def facts(self, report_path: str) -> dict[str, Any] | None:
        """The report's facts, None when its file is gone or is no longer a report."""
        path = Path(report_path)
        try:
            stat = path.stat()
        except OSError:
            return None
        key = [stat.st_size, stat.st_mtime_ns]
        hit = self.entries.get(report_path)
        if hit and hit.get("key") == key:
            return dict(hit["facts"])
        try:
            found = report_facts(document.load(path), path.parent)
        except (BadInput, OSError):  # not a report (any more): the row says so, one bad row never fails the page
            return None
        self.entries[report_path] = {"key": key, "facts": found}
        self.changed = True
        return found

    def save(self) -> None:
        if self.changed:
            try:
                fs.write_atomic(self.path, json.dumps({"format": CACHE_FORMAT, "entries": self.entries}) + "\n")
            except OSError:
                pass  # a read-only history still renders; the next writable render keeps the cache


@dataclass(frozen=True)
class Night:
    row: Run
    facts: dict[str, Any] | None  # None: the report file is gone (or is no report)
    classes: dict[str, str]  # gate -> new | recurring | fixed | unknown

    @property
    def missing(self) -> str:
        """Why this night has no facts: its report file is gone, or is not a report (''  when it has them)."""
        if self.facts is not None:
            return ""
        return "report unreadable" if Path(self.row.report_path).is_file() else "report gone"

    @property
    def state(self) -> str:
        """bad (not accepted), warn (accepted with a regression flag) or ok."""
        return "bad" if self.row.verdict != "ACCEPTED" else "warn" if self.row.regression else "ok"

    def statuses(self) -> dict[str, str]:
        return {g["name"]: g["status"] for g in (self.facts or {}).get("gates", [])}

    @property
    def first_bad(self) -> dict[str, str] | None:
        """What `builder nightly --bisect` named for this night (bisect/ beside its report), else None."""
        path = Path(self.row.report_path).parent / BISECT / "bisect.json"
        try:
            first = json.loads(path.read_text()).get("first_bad") if path.is_file() else None
        except (OSError, ValueError):
            return None
        if not isinstance(first, dict):
            return None
        return {"component": str(first.get("component")), "commit": str(first.get("commit")),
                "gate": str(first.get("gate")), "md": str(path.with_suffix(".md"))}

    def cells(self, gates: list[str]) -> list[dict[str, Any] | None]:
        """This night's gate results in the page's column order (None: the gate is not in its report)."""
        by_name = {g["name"]: g for g in (self.facts or {}).get("gates", [])}
        return [by_name.get(g) for g in gates]


def classify(previous: Night | None, facts: dict[str, Any] | None) -> dict[str, str]:
    """Each gate's failure class since the previous night: new (failing now, not then), recurring (failing
    both), fixed (passing now, failing then); unknown when the previous night's report is gone."""
    if facts is None:
        return {}
    now = {g["name"]: g["status"] for g in facts["gates"]}
    if previous is not None and previous.facts is None:
        return {g: "unknown" for g, s in now.items() if s in FAILING}
    before = previous.statuses() if previous else {}
    out = {}
    for gate, status in now.items():
        if status in FAILING:
            out[gate] = "recurring" if before.get(gate) in FAILING else "new"
        elif status == "pass" and before.get(gate) in FAILING:
            out[gate] = "fixed"
    return out


def nights(history: History, name: str, last: int, cache: FactsCache) -> list[Night]:
    """The last `last` nights of a pins name, oldest first, classified against the night before each."""
    rows = history.runs(name)
    start = max(len(rows) - last, 0)
    out: list[Night] = []
    previous: Night | None = None
    if start > 0:
        previous = Night(rows[start - 1], cache.facts(rows[start - 1].report_path), {})
    for row in rows[start:]:
        facts = cache.facts(row.report_path)
        night = Night(row, facts, classify(previous, facts))
        out.append(night)
        previous = night
    return out


# ---------------------------------------------------------------- charts


def _series(night_list: list[Night], pick: Any) -> list[float]:
    return [math.nan if n.facts is None or (v := pick(n.facts)) is None else float(v) for n in night_list]


def trends(night_list: list[Night]) -> dict[str, dict[str, list[float]]]:
    """The charts' data: per chart, per line, one value per night (NaN: not recorded)."""
    names = [g for g in GATES if any(g in n.statuses() for n in night_list)]
    seconds = {n: _series(night_list, lambda f, n=n: next((g["seconds"] for g in f["gates"] if g["name"] == n), None))
               for n in names}
    return {
        "throughput ratio (aligned / control)": {"ratio": _series(night_list, lambda f: f["ratio"]),
                                                 "min_ratio": _series(night_list, lambda f: f["min_ratio"])},
        "gate wall time (s)": {n: s for n, s in seconds.items() if not all(math.isnan(v) for v in s)},
        "stage time (s)": {s: _series(night_list, lambda f, s=s: f["stages"].get(s)) for s in STAGES},
        "size (MB)": {"image": [v / 1e6 for v in _series(night_list, lambda f: f["image_size"])],
                      ".sqsh": [v / 1e6 for v in _series(night_list, lambda f: f["sqsh_size"])]},
        "control arm difference (diff max)": {"control": _series(night_list, lambda f: f["control_diff"])},
    }


def charts(night_list: list[Night]) -> str:
    """The trend charts as one inline SVG (empty when there is no night)."""
    if not night_list:
        return ""
    import matplotlib  # lazy: matplotlib loads in about 0.3 s; only the page draws
    from matplotlib.figure import Figure  # lazy: matplotlib, as above
    from matplotlib.ticker import FormatStrFormatter  # lazy: matplotlib, as above

    data = trends(night_list)
    count = len(night_list)
    x = list(range(count))
    marker = "o" if count <= MARKERS_UP_TO else None
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "builder-history", "font.size": 9,
                                "axes.spines.top": False, "axes.spines.right": False}):
        fig = Figure(figsize=(11, 1.9 * len(data)))  # a fixed layout: constrained layout draws twice (0.5 s)
        axes = fig.subplots(len(data), 1, sharex=True)
        fig.subplots_adjust(left=0.07, right=0.99, top=0.97, bottom=0.06, hspace=0.35)
        edges = [i - 0.5 for i in range(count + 1)]
        bands = {colour: [1.0 if n.state == state else 0.0 for n in night_list] + [0.0]
                 for state, colour in (("bad", "#cf222e"), ("warn", "#bf8700"))}
        for ax, (title, lines) in zip(axes, data.items()):
            for colour, heights in bands.items():  # one shape per axis and colour (an axvspan per night costs 2 ms)
                if any(heights):
                    ax.fill_between(edges, 0, heights, step="post", color=colour, alpha=0.18, linewidth=0,
                                    transform=ax.get_xaxis_transform())
            for label, values in lines.items():
                if all(math.isnan(v) for v in values):
                    continue
                if label == "min_ratio":
                    ax.step(x, values, where="mid", color="#57606a", linestyle="--", linewidth=1, label=label)
                else:
                    ax.plot(x, values, marker=marker, markersize=3, linewidth=1.2, label=label)
            ax.set_title(title, loc="left", fontsize=9)
            ax.yaxis.set_major_formatter(FormatStrFormatter("%.6g"))  # no "1e-7" multiplier over the title
            if ax.get_legend_handles_labels()[0]:
                ax.legend(loc="lower right", bbox_to_anchor=(1, 1), fontsize=7, ncols=6, frameon=False)
            else:
                ax.text(0.5, 0.5, "not recorded", transform=ax.transAxes, ha="center", color="#8c959f")
        ratios = data["throughput ratio (aligned / control)"]["ratio"]
        failing = [i for i, n in enumerate(night_list) if n.state == "bad"]
        if failing:
            low = min((v for v in ratios if not math.isnan(v)), default=0.0)
            dots = axes[0].scatter(failing, [low if math.isnan(ratios[i]) else ratios[i] for i in failing],
                                   marker="X", s=40, color="#cf222e", zorder=3, label="not accepted")
            dots.set_urls([f"#night-{night_list[i].row.id}" for i in failing])
        step = max(1, math.ceil(count / 10))
        days = [n.row.started[:10] for n in night_list]
        labels = days if len(set(days)) == count else [n.row.started[5:16].replace("T", " ") for n in night_list]
        axes[-1].set_xticks(x[::step], labels[::step])  # dates, with the time when a day has several nights
        axes[-1].set_xlim(-0.6, count - 0.4)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text[text.index("<svg"):], count=1, flags=re.S)


# ---------------------------------------------------------------- page


@dataclass(frozen=True)
class Section:
    name: str
    nights: list[Night]
    gates: list[str]
    chart: str
    compare: dict[str, Any] | None
    compare_note: str


def newest_comparison(history: History, night_list: list[Night], settings: Settings) -> tuple[dict[str, Any] | None, str]:
    """The newest night with a report against the last accepted run before it."""
    newest = next((n for n in reversed(night_list) if n.facts is not None), None)
    if newest is None:
        return None, "no night with a report to compare"
    path = Path(newest.row.report_path)
    try:
        report = document.load(path)
        old_path = compare_mod.last_accepted(history, report, path)
        return compare_mod.compare(document.load(old_path), report, old_path, path, settings), ""
    except (BadInput, OSError) as exc:  # no earlier accepted run, or a report gone: the page says so
        return None, f"no comparison: {str(exc)[:200]}"


class ChartCache:
    """page-charts/<sha256>.svg beside the history: a section's charts under the sha256 of what they draw (the
    trend data, each night's state, row ID and start, CHART_FORMAT). A render draws only what it does not find,
    and removes what it no longer draws; a cache it cannot read or write only costs the drawing."""

    def __init__(self, where: Path):
        self.where = where
        self.used: set[str] = set()

    @staticmethod
    def key(night_list: list[Night]) -> str:
        drawn = [CHART_FORMAT, trends(night_list), [[n.state, n.row.id, n.row.started] for n in night_list]]
        return hashlib.sha256(json.dumps(drawn, sort_keys=True, default=str).encode()).hexdigest()

    def chart(self, night_list: list[Night]) -> str:
        if not night_list:
            return ""
        key = self.key(night_list)
        self.used.add(key)
        path = self.where / f"{key}.svg"
        try:
            return path.read_text()
        except OSError:
            pass
        drawn = charts(night_list)
        try:
            self.where.mkdir(parents=True, exist_ok=True)
            fs.write_atomic(path, drawn)
        except OSError:
            pass  # a read-only history still renders
        return drawn

    def prune(self) -> None:
        """Remove the charts this render did not draw (another name's render keeps its own on its next run)."""
        try:
            stale = [p for p in self.where.glob("*.svg") if p.stem not in self.used]
        except OSError:
            return
        for path in stale:
            path.unlink(missing_ok=True)


def section(history: History, name: str, last: int, cache: FactsCache, settings: Settings,
            drawn: ChartCache) -> Section:
    night_list = nights(history, name, last, cache)
    gates = [g for g in GATES if any(g in n.statuses() for n in night_list)]
    gates += sorted({g for n in night_list for g in n.statuses()} - set(gates))
    diff, note = newest_comparison(history, night_list, settings)
    return Section(name, night_list, gates, drawn.chart(night_list), diff, note)


def render(history: History, settings: Settings, names: list[str] | None = None, last: int = DEFAULT_LAST) -> str:
    """The page for these pins names (default: every name in the history), the last `last` nights of each."""
    cache, drawn = FactsCache(history.path.parent / CACHE), ChartCache(history.path.parent / CHARTS)
    sections = [section(history, n, last, cache, settings, drawn) for n in (names or history.names())]
    cache.save()
    if names is None:  # a page of every name: what it did not draw is no longer on any page
        drawn.prune()
    return html_mod.render("history.html.j2", sections=sections, last=last, history=str(history.path),
                           generated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def write(text: str, *paths: Path) -> list[Path]:
    for path in paths:
        fs.write_atomic(path, text)
    return list(paths)


def history_page(history: History, settings: Settings, names: list[str] | None = None, last: int = DEFAULT_LAST,
                 out: Path | None = None) -> Path:
    """`builder history`: the page of these pins names (default: every name in the history), the last `last` nights
    of each, written to `out` (default: history.html beside the history's rows)."""
    if last < 1:
        raise BadInput(f"--last: expected at least 1 night, got {last}")
    path = out or history.path.parent / PAGE
    with log.step("history page"):
        write(render(history, settings, names, last), path)
    return path


def write_night(history: History, run_dir: Path, report: Report, settings: Settings,
                timings: dict[str, Any]) -> Path | None:
    """After a nightly's row: its step timings and lock copy beside the report (what the page and compare read),
    then the history page beside the rows and a copy in the run directory. The page is a view: one that fails is
    one line and None, and the nightly's verdict stands."""
    fs.write_atomic(run_dir / TIMINGS, json.dumps(timings, indent=1, sort_keys=True) + "\n")
    lock_file = Path(str((html_mod.plain(report.run_manifest).get("run") or {}).get("lock_file") or "-"))
    if lock_file.is_file() and fs.sha256_file(lock_file) == report.lock_sha256:
        fs.write_atomic(run_dir / compare_mod.LOCK_COPY, lock_file.read_bytes())
    where = history.path.parent / PAGE
    try:
        write(render(history, settings), run_dir / PAGE, where)
    except Exception as exc:  # the page is a view: the verdict stands without it
        log.info(f"history page not written: {type(exc).__name__}: {str(exc)[:200]}")
        return None
    log.info(f"history page: {where}")
    return where
