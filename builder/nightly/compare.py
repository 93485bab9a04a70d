"""`builder compare A B`: what moved between two runs' reports (A the baseline, B the candidate; the word
`last-accepted` in place of A is the newest ACCEPTED run of B's pins name before B, from the nightly history).

It lists the commits that moved, the lock lines that changed, the image layers that changed (digest and size,
from the build's OCI manifest in the blob store), the gate evidence that moved (diff maxima, throughput medians
with their spread, JIT kernels, processes) and whether the throughput difference is within the performance
gate's noise. What a report does not hold, or a file `builder gc` removed, reads "unknown" with the reason.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from acceptance import perf as perf_rule
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import ArmStats, Evidence, Report, number
from builder.engine import normalize
from builder.nightly.history import History
from builder.report import document
from builder.report import html as html_mod

LAST_ACCEPTED = "last-accepted"
LOCK_COPY = "lock.txt"  # the lock as the run read it, kept beside its report by `builder nightly`
DIFF_GATES = ("zero_update", "rl_step", "control")


def last_accepted(history: History, report: Report, report_path: Path) -> Path:
    """The newest ACCEPTED nightly run of the report's pins name before it (before its own row when the history
    has it) whose report still exists; BadInput when there is none. A run by hand is never the baseline."""
    rows = history.runs(report.name)
    mine = next((i for i, r in enumerate(rows) if Path(r.report_path).resolve() == report_path.resolve()), len(rows))
    for row in reversed(rows[:mine]):
        if row.verdict == "ACCEPTED" and row.kind == "nightly" and Path(row.report_path).is_file():
            return Path(row.report_path)
    raise BadInput(f"{LAST_ACCEPTED}: no accepted nightly run of {report.name!r} before {report_path} in {history.path}")


def _side(report: Report, path: Path) -> dict[str, Any]:
    return {"path": str(path), "name": report.name, "verdict": report.verdict, "image_id": report.image_id,
            "created": report.created, "digest": report.publish.digest if report.publish else None}


def commits(old: Report, new: Report) -> list[dict[str, Any]]:
    out = []
    for name, comp in new.sources.components.items():
        was = old.sources.components.get(name)
        out.append({"component": name, "pr": comp.pr, "url": comp.url, "old": was.commit if was else None,
                    "new": comp.commit, "old_pr": was.pr if was else None,
                    "moved": was is None or was.commit != comp.commit})
    return out


def lock_lines(report: Report, report_path: Path) -> list[str] | None:
    """The lock's requirement lines as this run read them: the copy beside the report, else the lock file
    named in the run manifest while its sha256 is still the one the report recorded; None when neither."""
    named = (html_mod.plain(report.run_manifest).get("run") or {}).get("lock_file")
    for path in (report_path.parent / LOCK_COPY, Path(named) if isinstance(named, str) else None):
        if path is None or not path.is_file():
            continue
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() == report.lock_sha256:
            return [line for line in data.decode().splitlines() if line.strip() and not line.startswith("#")]
    return None


def lock(old: Report, new: Report, old_path: Path, new_path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"old_sha256": old.lock_sha256, "new_sha256": new.lock_sha256,
                           "changed": old.lock_sha256 != new.lock_sha256, "removed": [], "added": [], "note": None}
    if not out["changed"]:
        return out
    before, after = lock_lines(old, old_path), lock_lines(new, new_path)
    if before is None or after is None:
        out["note"] = "lines unknown: neither a copy beside the report nor a lock file with the recorded sha256"
        return out
    out["removed"] = [line for line in before if line not in set(after)]
    out["added"] = [line for line in after if line not in set(before)]
    return out


def manifest_layers(report: Report, settings: Settings) -> list[dict[str, Any]] | None:
    """The image's layer descriptors (digest, size), base first, from the build's OCI manifest in the blob store."""
    digest = report.build.manifest_digest if report.build else ""
    if not digest:
        return None
    path = normalize.blob_path(settings, digest)
    if not path.is_file():
        return None
    layers = json.loads(path.read_bytes()).get("layers") or []
    return [{"digest": str(d.get("digest")), "size": d.get("size")} for d in layers if isinstance(d, dict)]


def layers(old: Report, new: Report, settings: Settings) -> dict[str, Any]:
    before, after = manifest_layers(old, settings), manifest_layers(new, settings)
    if before is None or after is None:
        gone = dict.fromkeys((r.build.manifest_digest or "(none)") if r.build else "(no build record)"
                             for r, got in ((old, before), (new, after)) if got is None)
        return {"known": False, "rows": [], "changed": 0,
                "note": f"unknown: no OCI manifest {', '.join(gone)} in the blob store (not built here, or gc)"}
    rows = []
    for index in range(max(len(before), len(after))):
        a = before[index] if index < len(before) else None
        b = after[index] if index < len(after) else None
        rows.append({"index": index, "old": a, "new": b, "changed": (a or {}).get("digest") != (b or {}).get("digest")})
    return {"known": True, "rows": rows, "changed": sum(r["changed"] for r in rows), "note": None}



def diff_max(evidence: Evidence) -> float | None:
    """The largest logprob difference a gate recorded: over its steps, else its own diff_max."""
    found = [v for s in (evidence.steps or {}).values() if (v := number(s.get("diff_max"))) is not None]
    return max(found) if found else evidence.diff_max


def _arm(stats: ArmStats | None) -> str | None:
    if stats is None or stats.median is None:
        return None
    spread = f" (spread {stats.spread:.3g})" if stats.spread is not None else ""
    return f"{stats.median:.4g}{spread}"


def gate_items(report: Report) -> dict[str, dict[str, Any]]:
    """Per gate, the evidence worth comparing, as short values."""
    out: dict[str, dict[str, Any]] = {}
    for gate in report.gates:
        ev = gate.evidence
        items: dict[str, Any] = {"status": gate.status}
        if gate.name in DIFF_GATES:
            items["diff max"] = diff_max(ev)
        if gate.name == "performance":
            items["aligned median"], items["control median"] = _arm(ev.aligned), _arm(ev.control)
            items["ratio"] = ev.ratio
        jit = ev.jit
        if jit is not None:
            items["JIT kernels"] = ", ".join(jit.get("kernels") or []) or f"{jit.get('count', 0)} entries, no kernel"
        listed = report.processes.get(gate.name)
        if listed:
            names = sorted({str(p.get("name") or "?") for p in listed})
            items["processes"] = f"{len(listed)}: {', '.join(names)}"
        out[gate.name] = items
    return out


def evidence(old: Report, new: Report) -> list[dict[str, Any]]:
    before, after = gate_items(old), gate_items(new)
    out = []
    for gate in dict.fromkeys([*before, *after]):
        a, b = before.get(gate, {}), after.get(gate, {})
        items = [{"what": k, "old": a.get(k), "new": b.get(k), "moved": a.get(k) != b.get(k)}
                 for k in dict.fromkeys([*a, *b])]
        out.append({"gate": gate, "items": items, "moved": any(i["moved"] for i in items)})
    return out


def _runs(report: Report) -> tuple[list[Any], list[Any]] | None:
    """The performance runs of each arm: the acceptance's throughput record, else the performance gate's evidence."""
    tp = report.acceptance.throughput if report.acceptance else {}
    perf = next((g.evidence.runs for g in report.gates if g.name == "performance"), None)
    runs = [r for r in tp.get("runs") or perf or [] if isinstance(r, dict)]
    aligned = [r for r in runs if r.get("arm") == "aligned"]
    control = [r for r in runs if r.get("arm") == "control"]
    return (aligned, control) if aligned and control else None


def _confidence(report: Report) -> float:
    tp = report.acceptance.throughput if report.acceptance else {}
    value = tp.get("confidence")
    return float(value) if isinstance(value, (int, float)) else perf_rule.Rule(min_ratio=1).confidence


def noise(old: Report, new: Report) -> dict[str, Any]:
    """Whether the throughput ratio moved by more than the performance gate's noise: each run's band is the
    gate's own bounds on its pairs' ratios (acceptance.perf, at the run's confidence); bands that overlap mean the
    difference is within the noise."""
    a, b = _runs(old), _runs(new)
    if a is None or b is None:
        return {"verdict": "unknown", "reason": "a run has no performance gate runs (per-arm throughputs) to judge"}
    bands = []
    for report, (aligned, control) in ((old, a), (new, b)):
        found = perf_rule.band(aligned, control, _confidence(report))
        if found is None:
            return {"verdict": "unknown", "reason": "a performance run lacks its throughput or its pair"}
        bands.append(found)
    old_band, new_band = bands
    within = old_band["low"] <= new_band["high"] and new_band["low"] <= old_band["high"]
    shown = (f"ratio {old_band['ratio']:.4g} [{old_band['low']:.4g}, {old_band['high']:.4g}] -> "
             f"{new_band['ratio']:.4g} [{new_band['low']:.4g}, {new_band['high']:.4g}]")
    return {"verdict": "within" if within else "outside", "old": old_band, "new": new_band,
            "reason": f"{shown}: the runs' bands {'overlap' if within else 'do not overlap'}"}


def compare(old: Report, new: Report, old_path: Path, new_path: Path, settings: Settings) -> dict[str, Any]:
    diff: dict[str, Any] = {"old": _side(old, old_path), "new": _side(new, new_path), "commits": commits(old, new),
            "lock": lock(old, new, old_path, new_path), "layers": layers(old, new, settings),
            "evidence": evidence(old, new), "noise": noise(old, new)}
    moved = [c["component"] for c in diff["commits"] if c["moved"]]
    gates = [e["gate"] for e in diff["evidence"] if e["moved"]]
    lay = diff["layers"]
    diff["summary"] = (f"commits moved: {', '.join(moved) or 'none'}; lock "
                       f"{'changed' if diff['lock']['changed'] else 'unchanged'}; layers changed: "
                       f"{lay['changed'] if lay['known'] else 'unknown'}; gate evidence moved: {', '.join(gates) or 'none'};"
                       f" throughput against the gate's noise: {diff['noise']['verdict']}")
    return diff


def load_pair(a: str, b: str, history: History) -> tuple[tuple[Report, Path], tuple[Report, Path]]:
    """(old, new) reports from the command's arguments: two report.json paths, or `last-accepted` and one."""
    if b == LAST_ACCEPTED:
        a, b = b, a
    if b == LAST_ACCEPTED:
        raise BadInput(f"B: expected a report.json (at most one side may be {LAST_ACCEPTED})")
    new_path = Path(b)
    new = document.load(new_path)
    old_path = last_accepted(history, new, new_path) if a == LAST_ACCEPTED else Path(a)
    return (document.load(old_path), old_path), (new, new_path)


def _pr(commit: dict[str, Any]) -> str:
    """`#14`, or `#11 -> #14` when B pins another PR of the component than A."""
    old = commit["old_pr"]
    return f"#{old} -> #{commit['pr']}" if old not in (None, commit["pr"]) else f"#{commit['pr']}"


def _value(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def to_markdown(diff: dict[str, Any]) -> str:
    old, new = diff["old"], diff["new"]
    out = [f"## Compare `{old['name']}`: {old['verdict']} -> {new['verdict']}", "", f"{diff['summary']}.", "",
           f"- A: `{old['path']}` ({old['created'] or 'unknown'}), image `{html_mod.short(old['image_id'])}`",
           f"- B: `{new['path']}` ({new['created'] or 'unknown'}), image `{html_mod.short(new['image_id'])}`",
           "", "### Commits", "", "| Component | PR | A | B | Moved |", "|---|---|---|---|---|"]
    out += [f"| {c['component']} | {_pr(c)} | `{(c['old'] or '-')[:12]}` | `{c['new'][:12]}` | "
            f"{'**yes**' if c['moved'] else 'no'} |" for c in diff["commits"]]
    lk = diff["lock"]
    out += ["", "### Lock", "", f"sha256 `{lk['old_sha256'][:16]}` -> `{lk['new_sha256'][:16]}`: "
            + ("changed" if lk["changed"] else "unchanged") + (f"; {lk['note']}" if lk["note"] else "")]
    out += [f"- `- {line}`" for line in lk["removed"]] + [f"- `+ {line}`" for line in lk["added"]]
    lay = diff["layers"]
    out += ["", f"### Layers changed: {lay['changed'] if lay['known'] else 'unknown'}", ""]
    if lay["known"]:
        out += ["| # | A digest | A size | B digest | B size |", "|---|---|---|---|---|"]
        for row in (r for r in lay["rows"] if r["changed"]):
            a, b = row["old"] or {}, row["new"] or {}
            out.append(f"| {row['index']} | `{html_mod.short(a.get('digest'))}` | {html_mod.megabytes(a.get('size'))} | "
                       f"`{html_mod.short(b.get('digest'))}` | {html_mod.megabytes(b.get('size'))} |")
    else:
        out.append(lay["note"])
    out += ["", "### Gate evidence", "", "| Gate | Item | A | B |", "|---|---|---|---|"]
    out += [f"| {e['gate']} | {i['what']} | {_value(i['old'])} | {_value(i['new'])}{' **moved**' if i['moved'] else ''} |"
            for e in diff["evidence"] for i in e["items"]]
    out += ["", f"### Noise: {diff['noise']['verdict']}", "", diff["noise"]["reason"]]
    return "\n".join(out) + "\n"


def to_html(diff: dict[str, Any]) -> str:
    return html_mod.render("compare_page.html.j2", diff=diff)


FORMATS = ("md", "json", "html")


def compare_text(a: str, b: str, history: History, settings: Settings, fmt: str = "md") -> str:
    """`builder compare A B` as Markdown, JSON or one HTML page (A may be `last-accepted`)."""
    if fmt not in FORMATS:
        raise BadInput(f"--format: expected md, json or html, got {fmt[:40]!r}")
    (old, old_path), (new, new_path) = load_pair(a, b, history)
    diff = compare(old, new, old_path, new_path, settings)
    if fmt == "json":
        return json.dumps(diff, indent=2, sort_keys=True)
    return to_html(diff) if fmt == "html" else to_markdown(diff)
