"""Compare a run with the last ACCEPTED run of the same pins: commits, digest, image files, gates, metrics.
The report against report part (which commits moved, which gates changed status) is `builder compare`'s
(builder/nightly/compare.py: commits, gate_items), the one way two reports are diffed; this module adds what only
the nightly has: the registry digests, the image's files and distributions, the metrics and the regression flag.

`compare(...)` returns the JSON-able diff; `to_markdown(diff)` renders nightly-diff.md.  The regression
flag goes up when a gate that passed before reads anything else now, or when the throughput ratio
(aligned / control) drops by more than the pins' threshold. With the performance gate's runs, the drop is
judged by the gate's own sequential rule (acceptance.perf: bounds on the pairs' ratios): a run too noisy to
judge is noted, not flagged. Without runs (older reports), the single ratios are compared.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from acceptance import perf as perf_rule
from builder.core import files as fs
from builder.core.imageref import split_digest
from builder.core.records import Report
from builder.nightly import compare as report_diff

EVIDENCE_METRICS = ("throughput", "diff_max", "seconds")


def _files(manifest: dict[str, Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for comp in ((manifest or {}).get("components") or {}).values():
        out.update(comp.get("files") or {})
    return out


def _changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[Any]]:
    return {"added": sorted(set(new) - set(old)), "removed": sorted(set(old) - set(new)),
            "changed": sorted(k for k in set(old) & set(new) if old[k] != new[k])}


def metrics(report: Report) -> dict[str, float]:
    """Numbers worth a delta: the throughput record and a few scalars of each gate's evidence."""
    out: dict[str, float] = {}
    tp = report.acceptance.throughput if report.acceptance else {}
    for key in ("aligned", "control", "ratio"):
        value = tp.get(key)
        if isinstance(value, float):
            out[f"throughput.{key}"] = value
    for gate in report.gates:
        for key in EVIDENCE_METRICS:
            value = getattr(gate.evidence, key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{gate.name}.{key}"] = float(value)
    return out


def performance(report: Report, previous_ratio: float | None, threshold: float) -> dict[str, Any] | None:
    """The performance gate's rule on this run's runs, with the floor at the previous accepted ratio less the
    threshold; None when this run has no per-run throughput or there is no previous ratio."""
    tp = report.acceptance.throughput if report.acceptance else {}
    runs = tp.get("runs") or []
    aligned = [r for r in runs if isinstance(r, dict) and r.get("arm") == "aligned"]
    control = [r for r in runs if isinstance(r, dict) and r.get("arm") == "control"]
    if not aligned or not control or not previous_ratio or previous_ratio <= 0:
        return None
    floor = previous_ratio * (1 - threshold)
    bound, confidence = tp.get("max_spread"), tp.get("confidence")
    max_spread = float(bound) if isinstance(bound, (int, float)) else 1.5
    rule = perf_rule.Rule(min_ratio=floor, max_spread=max_spread, max_pairs=len(aligned),
                          confidence=float(confidence) if isinstance(confidence, (int, float)) else 0.95)
    status, reason, evidence = perf_rule.decide(aligned, control, rule, str(tp.get("metric") or "throughput"))
    return {"status": status, "reason": reason, "floor": floor, "previous_ratio": previous_ratio,
            "ratio": evidence["ratio"], "max_spread": max_spread,
            "aligned": evidence["aligned"]["runs"], "control": evidence["control"]["runs"]}


def gate_changes(previous: Report, report: Report) -> list[dict[str, str]]:
    """The gates of `report` whose status differs from `previous` (a gate it did not run reads not_run), from
    the compare's per-gate items."""
    moved = {e["gate"]: e for e in report_diff.evidence(previous, report)}
    out = []
    for gate in report.gates:
        status = next(i for i in moved[gate.name]["items"] if i["what"] == "status")
        old = str(status["old"] or "not_run")
        if old != gate.status:
            out.append({"gate": gate.name, "old": old, "new": gate.status})
    return out


def compare(report: Report, manifest: dict[str, Any] | None, digest: str | None, previous: Report | None,
            previous_manifest: dict[str, Any] | None, previous_digest: str | None, threshold: float,
            commit_log: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The diff of `report` against `previous` (None: no accepted run to compare with)."""
    diff: dict[str, Any] = {"pins_name": report.name, "verdict": report.verdict, "image_id": report.image_id, "digest": digest,
                  "threshold": threshold, "previous": None, "regression": {"flag": False, "reasons": []}}
    if previous is None:
        diff["summary"] = "first accepted run of these pins: nothing to compare with"
        return diff
    diff["previous"] = {"image_id": previous.image_id, "digest": previous_digest, "created": previous.created}
    commits = {c["component"]: {"old": c["old"], "new": c["new"], "changed": c["moved"],
                                "log": commit_log.get(c["component"], [])} for c in report_diff.commits(previous, report)}
    diff["commits"] = commits
    diff["same_image"] = report.image_id == previous.image_id
    diff["same_digest"] = None if not (digest and previous_digest) else digest == previous_digest
    diff["files"] = _changes(_files(previous_manifest), _files(manifest))
    diff["distributions"] = _changes((previous_manifest or {}).get("distributions") or {},
                                     (manifest or {}).get("distributions") or {})
    diff["gates"] = gate_changes(previous, report)
    old_m, new_m = metrics(previous), metrics(report)
    diff["metrics"] = [{"metric": k, "old": old_m[k], "new": new_m[k], "delta": new_m[k] - old_m[k],
                        "relative": (new_m[k] - old_m[k]) / old_m[k] if old_m[k] else None}
                       for k in sorted(set(old_m) & set(new_m))]
    reasons = [f"gate {g['gate']}: {g['old']} -> {g['new']}" for g in diff["gates"] if g["old"] == "pass"]
    ratio = next((m for m in diff["metrics"] if m["metric"] == "throughput.ratio"), None)
    perf = performance(report, ratio["old"] if ratio else None, threshold)
    diff["performance"] = perf
    if perf is not None:
        if perf["status"] == "fail":
            now = "unknown" if perf["ratio"] is None else f"{perf['ratio']:.4g}"
            reasons.append(f"throughput ratio {perf['previous_ratio']:.4g} -> {now}, floor {perf['floor']:.4g}"
                           f" (previous ratio - {threshold:.0%}): {perf['reason']}")
    elif ratio and ratio["relative"] is not None and ratio["relative"] < -threshold:
        reasons.append(f"throughput ratio {ratio['old']:.4g} -> {ratio['new']:.4g} "
                       f"({ratio['relative']:+.1%}, threshold -{threshold:.0%}; single runs, no noise bound)")
    diff["regression"] = {"flag": bool(reasons), "reasons": reasons}
    if perf is not None and perf["status"] == "inconclusive":
        diff["regression"]["noisy"] = perf["reason"]
    nothing = (not any(c["changed"] for c in commits.values()) and diff["same_image"]
               and diff["same_digest"] is not False and not any(diff["files"].values()))
    diff["no_change"] = nothing
    moved = sum(1 for c in commits.values() if c["changed"])
    differ = sum(len(v) for v in diff["files"].values())
    diff["summary"] = (f"no change: same commits, same image {digest or report.image_id}" if nothing else
                       f"{moved} component(s) moved; image {'unchanged' if diff['same_image'] else 'rebuilt'}; "
                       f"{differ} image file(s) differ")
    return diff


def _short(sha: str | None) -> str:
    if not sha:
        return "-"
    algo, hexpart = split_digest(sha)
    return f"`{algo + ':' if algo else ''}{hexpart[:12]}`"


def to_markdown(diff: dict[str, Any]) -> str:
    out = [f"## Nightly `{diff['pins_name']}`: **{diff['verdict']}**"
           + (" - **REGRESSION**" if diff["regression"]["flag"] else ""), "", f"{diff['summary']}.", ""]
    for reason in diff["regression"]["reasons"]:
        out.append(f"- regression: {reason}")
    if diff["regression"].get("noisy"):
        out.append(f"- throughput not judged (too noisy): {diff['regression']['noisy']}")
    if diff.get("moved"):
        out += ["", "### PR heads followed", "", "| Component | PR | Old | New | Ahead / behind |", "|---|---|---|---|---|"]
        out += [f"| {m['component']} | #{m['pr']} | {_short(m['old'])} | {_short(m['new'])} | +{m['ahead']} / -{m['behind']} |"
                for m in diff["moved"]]
    prev = diff["previous"]
    out += ["", "### Image", "", "| | Previous accepted | This run |", "|---|---|---|",
            f"| Image ID | {_short((prev or {}).get('image_id'))} | {_short(diff['image_id'])} |",
            f"| Registry digest | {(prev or {}).get('digest') or '-'} | {diff['digest'] or 'not published'} |"]
    if prev is None:
        return "\n".join(out) + "\n"
    out += ["", "### Commits", "", "| Component | Previous | Now | Commits |", "|---|---|---|---|"]
    for name, c in diff["commits"].items():
        log = "<br>".join(f"`{e['sha'][:12]}` {e['subject']}" for e in c["log"]) or ("-" if not c["changed"] else "?")
        out.append(f"| {name} | {_short(c['old'])} | {_short(c['new'])} | {log} |")
    files = diff["files"]
    out += ["", f"### Files in the image: {len(files['added'])} added, {len(files['removed'])} removed, "
                f"{len(files['changed'])} changed", ""]
    for kind in ("added", "removed", "changed"):
        out += [f"- {kind}: `{path}`" for path in files[kind][:50]]
    dists = diff["distributions"]
    if any(dists.values()):
        out += ["", "Distributions: " + "; ".join(f"{k} {', '.join(v)}" for k, v in dists.items() if v)]
    out += ["", "### Gates", ""]
    out += [f"- {g['gate']}: {g['old']} -> {g['new']}" for g in diff["gates"]] or ["no gate changed status"]
    out += ["", "### Metrics", "", "| Metric | Previous | Now | Delta |", "|---|---|---|---|"]
    out += [f"| {m['metric']} | {m['old']:.4g} | {m['new']:.4g} | {m['delta']:+.4g}"
            + (f" ({m['relative']:+.1%})" if m["relative"] is not None else "") + " |" for m in diff["metrics"]]
    if diff.get("tags"):
        t = diff["tags"]
        out += ["", "### Tags", "", f"`nightly` -> {t['digest']}; added {', '.join(t['added'])}; "
                f"pruned {', '.join(t['pruned']) or 'none'}"]
    return "\n".join(out) + "\n"


def write(diff: dict[str, Any], run_dir: Path) -> dict[str, Path]:
    paths = {"json": run_dir / "nightly-diff.json", "md": run_dir / "nightly-diff.md"}
    fs.write_atomic(paths["json"], json.dumps(diff, indent=2, sort_keys=True) + "\n")
    fs.write_atomic(paths["md"], to_markdown(diff))
    return paths
