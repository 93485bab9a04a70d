"""The report: what was built from which PRs, what the gates found, one verdict.

`make_report` only assembles records; it never infers a value that was not captured (such items read
"unknown").  `write` renders report.json, report.md (pastes into a GitHub PR description) and
junit.xml (one testcase per gate).
"""
from __future__ import annotations

import json
import os
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from builder.core import files as fs
from builder.core.constants import GATES
from builder.core.errors import BadInput
from builder.core.evidence import PerfRun, ProcessRow, ReplaySummary
from builder.core.records import (
    AcceptanceResult,
    BuiltImage,
    CompatPin,
    Evidence,
    GateResult,
    PublishReceipt,
    Report,
    ResolvedSources,
    SlurmFacts,
    number,
)
from builder.core.safetext import clip
from builder.gating import replay
from builder.image.render import sha_tag
from builder.lock.record import Lock
from builder.pins.inputfile import read_text
from builder.pins.model import Pins
from builder.report import manifest as manifest_layers
from builder.report import results
from builder.report.ctrf import to_ctrf
from builder.report.manifest import UNKNOWN as UNKNOWN  # re-exported: report_mod.UNKNOWN

SEVERITY = {"fail": 3, "inconclusive": 2, "not_run": 1, "pass": 0}


# ---------------------------------------------------------------- tags


def image_tags(pins: Pins) -> list[str]:
    """The SHA tag (from the render stage's sha_tag) first, then the human tags of the pins."""

    tag = sha_tag(pins)
    return [tag] + [t for t in pins.image.tags if t != tag]


# ---------------------------------------------------------------- verdict


def gate_table(acceptance: AcceptanceResult | None, required: list[str]) -> list[GateResult]:
    """One row per known or required gate; a gate the acceptance result lacks reads not_run."""
    got: dict[str, GateResult] = {}
    for gate in acceptance.gates if acceptance else []:
        old = got.get(gate.name)
        if old is None or SEVERITY[gate.status] > SEVERITY[old.status]:  # duplicates: keep the worst
            got[gate.name] = gate
    names = list(GATES) + [n for n in list(required) + list(got) if n not in GATES]
    missing = "not in the acceptance result" if acceptance else "no acceptance run"
    rows = []
    for name in dict.fromkeys(names):
        rows.append(got.get(name) or GateResult(name=name, status="not_run", reason=missing))
    return rows


def verdict_reasons(gates: list[GateResult], required: list[str], sources: ResolvedSources,
                    build: BuiltImage | None, acceptance: AcceptanceResult | None,
                    manifest: dict[str, Any] | None) -> list[str]:
    """Everything that keeps the verdict from ACCEPTED; empty list = ACCEPTED."""
    reasons = []
    if acceptance is None:
        reasons.append("no acceptance result")
    if not required:
        reasons.append("acceptance.required_gates is empty: nothing required was tested")
    by_name = {g.name: g for g in gates}
    for name in required:
        gate = by_name[name]
        if gate.status != "pass":
            reasons.append(f"required gate {name}: {gate.status.replace('_', ' ')}"
                           + (f" ({gate.reason})" if gate.reason else ""))
    if build and acceptance and build.image_id != acceptance.image_id:
        reasons.append(f"acceptance ran on {acceptance.image_id}, the build made {build.image_id}")
    for name, commit in manifest_layers.image_commits(manifest, acceptance).items():
        want = sources.components.get(name)
        if want and commit != want.commit:
            reasons.append(f"image: {name} commit {commit} is not the pinned {want.commit}")
    return reasons


# ---------------------------------------------------------------- assembling


def make_report(pins: Pins, lock: Lock, sources: ResolvedSources, build: BuiltImage | None, acceptance: AcceptanceResult | None,
                image_manifest: dict[str, Any] | None = None, publish: PublishReceipt | None = None) -> Report:
    manifest = image_manifest or manifest_layers.find_manifest(acceptance)
    required = list(pins.acceptance.required_gates)
    gates = gate_table(acceptance, required)
    reasons = verdict_reasons(gates, required, sources, build, acceptance, manifest)
    return Report(
        verdict="NOT ACCEPTED" if reasons else "ACCEPTED", reasons=reasons, name=pins.name,
        sources=sources, build=build, acceptance=acceptance, publish=publish,
        run_manifest=manifest_layers.run_manifest(pins, lock, sources, build, acceptance, manifest, publish),
        platform=pins.base.platform, base_image=pins.base.image,
        image_id=build.image_id if build else (acceptance.image_id if acceptance else UNKNOWN),
        repository=pins.image.repository, tags=image_tags(pins), required_gates=required, gates=gates,
        compat=[CompatPin(**c.model_dump()) for c in pins.compat], lock_sha256=lock.sha256,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), processes=gate_processes(gates),
        lock_lines=lock_lines(gate_processes(gates), lock),
        runtime_libraries=runtime_libraries(pins, gate_processes(gates), lock, manifest,
                                            build.image_id if build else (acceptance.image_id if acceptance else None)),
    )


PROCESS_KEYS = ("pid", "ppid", "name", "argv", "executable", "mnt_ns", "modules", "libs", "complete", "status", "node",
                "failures", "libraries", "library_sha256", "library_deps")
NOT_DISTRIBUTIONS = ("jit", "base image", "unknown")
ROW = TypeAdapter(ProcessRow)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_lines(processes: dict[str, list[ProcessRow]], lock: Lock) -> dict[str, str]:
    """For each distribution that owns a native library some process loaded (acceptance.processes.owner): its line
    in the lock (`name==version`), "base image" (the base's own distributions), or a component's source."""
    names = {str(o).rsplit(" ", 1)[0] for listed in processes.values() for p in listed
             for o in (p.get("libraries") or {}).values() if o and o not in NOT_DISTRIBUTIONS}
    lines = {_norm(ln.split("==")[0].strip()): ln.split(" \\")[0].split("  #")[0].strip() for ln in lock.runtime.splitlines()
             if "==" in ln and not ln.lstrip().startswith(("#", "--"))}
    base = {_norm(b) for b in lock.native.base_records}
    return {n: lines.get(_norm(n)) or ("base image" if _norm(n) in base else "not in the lock: a component, built from"
                                       " its commit") for n in sorted(names)}


def runtime_libraries(pins: Pins, processes: dict[str, list[ProcessRow]], lock: Lock,
                      manifest: dict[str, Any] | None, image_id: str | None) -> list[dict[str, Any]]:
    """Each runtime library the pins name, with the seed's six layers: source (its lock line, "base image", or the
    commit of the component it is built into), installed package (import path, version), the native libraries
    each process loaded (path, sha256), JIT kernels, the image and the run (gate, pid)."""
    site = str((manifest or {}).get("site_packages") or "")
    versions = {_norm(k): v for k, v in ((manifest or {}).get("distributions") or {}).items()}
    comps = {name: getattr(pins.components, name) for name in ("vllm", "megatron", "verl")}
    lines = lock_lines({"": [{"libraries": {"": f"{lib.distribution} -"}} for lib in pins.runtime_libraries]}, lock)
    out = []
    for lib in pins.runtime_libraries:
        comp = comps[lib.built_into] if lib.built_into else None
        owner = _norm(comp.distribution if comp else lib.distribution)
        loaded = [{"gate": gate, "pid": p.get("pid"), "path": path, "sha256": (p.get("library_sha256") or {}).get(path),
                   **_deps((p.get("library_deps") or {}).get(path))}
                  for gate, listed in processes.items() for p in listed
                  for path, who in (p.get("libraries") or {}).items() if who and _norm(str(who).rsplit(" ", 1)[0]) == owner]
        source = (f"native input of {lib.built_into} (built from commit {comp.commit})" if comp
                  else lines.get(lib.distribution, "-"))
        root = (lib.import_root or "").replace(".", "/")
        where = f"{site}/{root}" if site and root else next(  # no manifest kept: where its libraries were loaded
            (str(x["path"]).split(f"/{root}/")[0] + f"/{root}" for x in loaded if root and f"/{root}/" in str(x["path"])),
            None)
        owned = [str(who) for listed in processes.values() for p in listed for who in (p.get("libraries") or {}).values()
                 if who and _norm(str(who).rsplit(" ", 1)[0]) == owner]
        out.append({"distribution": lib.distribution, "built_into": lib.built_into, "source": source,
                    "installed": {"import_path": where,
                                  "version": versions.get(owner) or (owned[0].rsplit(" ", 1)[-1] if owned else None)},
                    "loaded": loaded, "jit": "none recorded", "image": image_id,
                    "run": sorted({f"{x['gate']} pid {x['pid']}" for x in loaded})})
    return out


def _deps(found: object) -> dict[str, list[str] | None]:
    """A loaded library's DT_NEEDED names and CUDA targets as the gate read them (None: an older suite's record)."""
    found = found if isinstance(found, dict) else {}
    return {k: [str(x) for x in v] if isinstance(v := found.get(k), list) else None for k in ("needed", "cuda_arches")}


def _needs(loaded: list[dict[str, Any]]) -> str:
    """What the loaded libraries need (DT_NEEDED) beyond each other, and their CUDA targets ("none": CPU code)."""
    if not loaded or any(x.get("needed") is None for x in loaded):
        return "not read"
    names = {os.path.basename(str(x["path"])) for x in loaded}
    needs = sorted({n for x in loaded for n in x["needed"] or []} - names)
    arches = sorted({a for x in loaded for a in x.get("cuda_arches") or []})
    return f"{clip(', '.join(needs) or 'nothing else', 160)}; CUDA: {', '.join(arches) or 'none'}"


def runtime_libraries_markdown(report: Report) -> list[str]:
    rows = [[r["distribution"] + (f" (in {r['built_into']})" if r.get("built_into") else ""), r["source"],
             f"{(r.get('installed') or {}).get('import_path') or '-'} {(r.get('installed') or {}).get('version') or ''}",
             f"{len(r.get('loaded') or [])}: " + clip(", ".join(sorted({os.path.basename(str(x["path"]))
                                                                      for x in r.get("loaded") or []})), 160),
             _needs(r.get("loaded") or []),
             r.get("jit"), "this image" if r.get("image") else "-", "; ".join(r.get("run") or []) or "not loaded"]
            for r in report.runtime_libraries]
    return ["", "### Runtime libraries (six layers)", "", *_table(
        ["Library", "Source", "Installed", "Loaded", "Needs (DT_NEEDED); CUDA targets", "JIT", "Image", "Run"],
        rows)] if rows else []


def libraries_markdown(report: Report) -> list[str]:
    """Per gate and process, the native libraries it mapped by owning distribution, with the lock line."""
    rows = []
    for gate, listed in report.processes.items():
        for p in listed:
            owned: dict[str, list[str]] = {}
            for path, who in (p.get("libraries") or {}).items():
                owned.setdefault(str(who) if who else "none (fails)", []).append(os.path.basename(str(path)))
            for who, names in sorted(owned.items()):
                name = who.rsplit(" ", 1)[0]
                rows.append([gate, p.get("pid"), who, f"{len(names)}: {clip(', '.join(sorted(names)), 160)}",
                             report.lock_lines.get(name, "-") if who not in NOT_DISTRIBUTIONS else who])
    return ["", "### Native libraries per process", "", *_table(
        ["Gate", "PID", "Owner", "Libraries mapped", "Lock line"], rows)] if rows else []


def gate_processes(gates: list[GateResult]) -> dict[str, list[ProcessRow]]:
    """Per recipe gate, the Python processes its recipe ran, as the per-process hook recorded them
    (acceptance.processes), every node's (a recipe across nodes: the other ranks' too); the performance gate:
    those of every run, each with its run."""
    out: dict[str, list[ProcessRow]] = {}

    def keep(gate: str, listed: object, **extra: str) -> None:
        if isinstance(listed, list):
            out.setdefault(gate, []).extend(ROW.validate_python({**{k: p.get(k) for k in PROCESS_KEYS}, **extra})
                                            for p in listed if isinstance(p, dict))

    for gate in gates:
        ev = gate.evidence
        keep(gate.name, ev.processes or (ev.failed_run or {}).get("processes"))
        for rank in ev.ranks or []:
            if isinstance(rank, dict):
                keep(gate.name, (rank.get("evidence") or {}).get("processes"))
        for run in ev.runs or []:
            if isinstance(run, dict):
                keep(gate.name, run.get("processes"), run=f"{run.get('arm')} {run.get('run')}")
    return out


def processes_markdown(processes: dict[str, list[ProcessRow]]) -> list[str]:
    if not processes:
        return []
    rows = []
    for gate, listed in processes.items():
        for p in listed:
            modules = p.get("modules") or {}
            dirs = sorted({os.path.dirname(str(v)) for v in modules.values() if v})
            rows.append([gate + (f" ({p['run']})" if p.get("run") else ""), p.get("node") or "-", p.get("pid"),
                         p.get("ppid"),
                         p.get("name") or "-", clip(" ".join(str(a) for a in p.get("argv") or []), 120),
                         p.get("mnt_ns"), f"{len(modules)} from {', '.join(dirs)[:160] or '-'}", p.get("libs"),
                         "complete" if p.get("complete") else "partial (killed?)",
                         p.get("status") if not (failed := p.get("failures")) else f"fail: {failed[0]}"])
    return ["", "### Processes per gate", "",
            *_table(["Gate", "Node", "PID", "Parent", "Name", "Command", "Mount ns", "Component modules", "Libraries",
                     "Record", "Status"], rows)]


# ---------------------------------------------------------------- markdown


def build_isolation_markdown(build: BuiltImage | None) -> list[str]:
    """What the build container saw (the BUILD-ENV record: in the build log and report.json's build.isolation,
    not on the console): its network interfaces, how many mounts, and any isolation problem."""
    seen = build.isolation if build else {}
    if not seen:
        return []
    if not seen.get("checked"):
        return ["", f"Build container isolation: not checked ({seen.get('reason') or UNKNOWN})."]
    problems = "; ".join(str(p) for p in seen.get("problems") or []) or "none"
    return ["", f"Build container isolation: network interfaces {', '.join(seen.get('net') or []) or 'none'}, "
                f"{len(seen.get('mountinfo') or [])} mounts (the whole record in report.json: build.isolation), "
                f"problems: {problems}."]


def native_markdown(data: dict[str, Any]) -> list[str]:
    inputs = data.get("inputs")
    out = ["", "### Native build inputs", ""]
    if isinstance(inputs, list) and inputs:
        out += _table(["Component", "Input", "Repository", "GIT_TAG", "Commit", "Tree", "Export sha256", "Received as",
                       "Declared at"],
                      [[i["component"], i["name"], i["url"], i["ref"], _code(i["commit"]), _code(i["tree"][:12]),
                        _code(i["export_sha256"][:16]), i["receive"], i["declared"]] for i in inputs])
    else:
        out += ["none" if isinstance(inputs, list) else UNKNOWN]
    knobs = data.get("knobs")
    if isinstance(knobs, dict) and knobs:
        out += ["", "Build knobs:", ""]
        out += _table(["Component", "Device", "CUDA archs", "MAX_JOBS", "NVCC_THREADS", "Native modules", "CMake",
                       "Base torch"],
                      [[n, k.get("device") or "-", " ".join(k.get("cuda_arch") or []) or "-", k.get("max_jobs") or "-",
                        k.get("nvcc_threads") or "-", ", ".join(k.get("modules") or []) or "-",
                        "yes" if k.get("cmake") else "no", "yes" if k.get("base_torch") else "no"]
                       for n, k in knobs.items()])
    for title, key in (("Torch pins relaxed to the base's torch", "relaxed"), ("Direct URLs locked from the index",
                                                                              "direct_urls")):
        if data.get(key):
            out += ["", f"{title}:", ""] + [f"- `{line}`" for line in data[key]]
    return out


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return " ".join(text.split()).replace("|", "\\|") or " "


def _code(value: Any) -> str:
    return f"`{value}`" if value not in (None, "", UNKNOWN) else UNKNOWN


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _flat(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for key, item in value.items():
            out += _flat(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = []
        for i, item in enumerate(value):
            out += _flat(item, f"{prefix}[{i}]")
        return out
    return [(prefix, value)]


def _num(value: Any) -> Any:
    return f"{value:.4g}" if isinstance(value, float) and value not in (0.0,) else value


def _step_facts(steps: dict[str, Any]) -> list[str]:
    """Per-step metrics as the largest value over the steps; weights: in how many steps they changed."""
    rows = [s for s in steps.values() if isinstance(s, dict)]
    out = []
    for metric in ("diff_max", "k3_kl"):
        values = [s[metric] for s in rows if number(s.get(metric)) is not None]
        if values:
            out.append(f"{metric} max {_num(max(values))} over {len(values)} steps")
    pairs = [(s["weights_before"], s["weights_after"]) for s in rows if s.get("weights_before") and s.get("weights_after")]
    if pairs:
        out.append(f"weights changed in {sum(b != a for b, a in pairs)} of {len(pairs)} steps")
    return out


def readable_evidence(ev: Evidence, limit: int = 300) -> str:
    """A gate's evidence chosen for reading: the numbers its verdict rests on, whole items only (the full
    record is in report.json)."""
    parts: list[str] = []
    if isinstance(ev.steps, dict):
        parts += _step_facts(ev.steps)
    numbers = {"ratio": ev.ratio, "min_ratio": ev.min_ratio, "diff_max": ev.diff_max, "k3_kl": ev.k3_kl,
               "throughput": ev.throughput}
    parts += [f"{key} {_num(value)}" for key, value in numbers.items() if number(value) is not None]
    for arm, stats in (("aligned", ev.aligned), ("control", ev.control)):
        if stats is not None and stats.median is not None:
            parts.append(f"{arm} median {_num(stats.median)}, spread {_num(stats.spread)}")
    if isinstance(ev.weights, list):
        parts.append(f"{len(ev.weights)} distinct weight checksum(s)")
    for name, comp in (ev.components or {}).items():
        comp = comp if isinstance(comp, dict) else {}
        commit = str((comp.get("stamp") or {}).get("commit") or UNKNOWN)
        parts.append(f"{name} {comp.get('version', UNKNOWN)} at {commit[:12]}")
    if isinstance(ev.failures, list):
        first = str(ev.failures[0]) if ev.failures else ""
        parts.append(f"{len(ev.failures)} failure(s)" + (f": {first}" if first and len(first) <= 120 else ""))
    if ev.exit_code:
        parts.append(f"exit code {ev.exit_code}")
    text = ""
    for i, part in enumerate(parts):
        more = f"; +{len(parts) - i} more in report.json"
        joined = f"{text}; {part}" if text else part
        if len(joined) + (len(more) if i + 1 < len(parts) else 0) > limit:
            return (text + more) if text else part[: limit - 3] + "..."
        text = joined
    return text or "-"


def to_markdown(report: Report) -> str:
    pub = report.publish
    out = [f"## Unified image `{report.name}`: **{report.verdict}**", ""]
    out += [f"- {r}" for r in report.reasons] + ([""] if report.reasons else [])
    digest = pub.digest if pub else "not published"
    base_digest = report.run_manifest.container.base_digest
    out += ["### Image", ""]
    out += _table(["Item", "Value"], [
        ["Repository", _code(report.repository)], ["Image ID", _code(report.image_id)],
        ["Registry digest", _code(digest) if pub else digest],
        *([["Published in index", _code(pub.index)]] if pub and pub.index else []),
        ["Tags", ", ".join(f"`{t}`" for t in report.tags) or UNKNOWN], ["Platform", report.platform],
        ["Base image", _code(report.base_image)], ["Base digest", _code(base_digest)],
        *([["Base index digest", _code(index)]] if (index := report.run_manifest.container.base_index_digest) else []),
        ["Lock sha256", _code(report.lock_sha256)]])
    out += ["", "### Pull requests in this image", ""]
    rows: list[list[Any]] = [
        [name, c.url, f"#{c.pr}", c.target, _code(c.merge_base), _code(c.commit), f"+{c.ahead} / -{c.behind}"]
        for name, c in report.sources.components.items()]
    out += _table(["Component", "Repository", "PR", "Target", "Merge-base", "Head", "Ahead / behind"], rows)
    out += [""]
    out += ["### Gates", ""]
    out += _table(["Gate", "Required", "Status", "Reason", "Evidence"],
                  [[g.name, "yes" if g.name in report.required_gates else "no", g.status.replace("_", " "),
                    g.reason, readable_evidence(g.evidence)] for g in report.gates])
    out += ["", "Each gate's full evidence is in report.json (`gates[].evidence`)."]
    out += replay_markdown(report.gates)
    out += rank_logs_markdown(report.gates)
    tp = report.acceptance.throughput if report.acceptance else {}
    if tp:
        show = {k: UNKNOWN if tp.get(k) is None else _num(tp[k]) for k in ("metric", "aligned", "control", "ratio")}
        source = f" ({tp['source']})" if tp.get("source") else ""
        pairs = (f" over {tp['pairs']} pairs ({tp['stopped']}; the ratio is their geometric mean, aligned and "
                 "control the arms' medians)" if tp.get("pairs") else "")
        out += ["", f"Rollout throughput (`{show['metric']}`){source}: aligned {show['aligned']}, control"
                    f" {show['control']}, ratio {show['ratio']}{pairs}."]
        out += _runs_table(tp.get("runs") or [])
    out += processes_markdown(report.processes)
    out += libraries_markdown(report)
    out += runtime_libraries_markdown(report)
    out += census_markdown(report.gates)
    out += jit_markdown(report.gates)
    out += ["", "### Build", ""]
    b = report.build
    if b:
        times = ", ".join(f"{k} {v:.1f} s{' (cached)' if k in b.cached_stages else ''}"
                          for k, v in b.stage_times.items()) or UNKNOWN
        out += _table(["Engine", "Builder", "Dockerfile sha256", "Context sha256", "Size", "Stage times", "Cached"],
                      [[b.engine_version, b.builder_version, _code(b.dockerfile_sha256), _code(b.context_sha256),
                        f"{b.size / 1e6:.1f} MB", times, "yes" if b.cached else "no"]])
    else:
        out += ["unknown (no build record: acceptance ran on an existing image)"]
    out += build_isolation_markdown(report.build)
    out += native_markdown(report.run_manifest.native_build)
    out += ["", "### Compatibility pins", ""]
    out += _table(["Package", "Version", "Reason"], [[c.package, c.version, c.reason]
                                                      for c in report.compat]) if report.compat else ["none"]
    if pub:
        out += ["", "### Publish receipt", ""]
        out += _table(["Repository", "Tags", "Digest", "Config digest", "Platform", "Verified", "Pushed at"],
                      [[pub.repository, ", ".join(pub.tags), _code(pub.digest), _code(pub.config_digest),
                        pub.platform, "yes" if pub.verified else "no", pub.pushed_at]])
    if report.rebuild:
        out += rebuild_markdown(report.rebuild)
    out += sqsh_markdown(report)
    out += cluster_markdown(report)
    out += ["", "<details><summary>Run manifest (six layers; unknown = not captured)</summary>", ""]
    out += run_manifest_markdown(report)
    out += ["", "</details>", ""]
    return "\n".join(out)


def run_manifest_markdown(report: Report) -> list[str]:
    """The run manifest's six layers, one row per item (a long value clipped to 160 characters)."""
    rows = []
    for layer, content in report.run_manifest.layers().items():
        for key, value in _flat(content):
            rows.append([layer, key or "-", value if len(_cell(value)) <= 160 else _cell(value)[:157] + "..."])
    return _table(["Layer", "Item", "Value"], rows)


def replay_markdown(gates: list[GateResult]) -> list[str]:
    """Per recipe gate: its replay bundle (link, step, what differs, first position) or nothing to replay."""
    out = []
    for gate in gates:
        found = gate.evidence.replay
        if gate.name not in replay.KINDS or not isinstance(found, dict):
            continue
        if not found.get("differs"):
            out.append(f"- {gate.name}: nothing to replay ({found.get('note') or 'no difference'})")
            continue
        first = (found.get("first") or [{}])[0]
        where = f"{first.get('tensor')}[{first.get('index')}]" if "tensor" in first else f"row/token {first.get('position')}"
        link = found.get("file") or replay.bundle_file(gate.name)
        out.append(f"- {gate.name}: replay bundle [{link}]({link}): step {found.get('step')}, {found.get('kind')} differ at"
                   f" {found.get('count')} position(s), first {where}; `builder replay report.json --gate {gate.name}`")
    return ["", "Replay:", ""] + out if out else []


def _runs_table(runs: list[PerfRun]) -> list[str]:
    """Every performance run: arm, run number, throughput, per-step values, status and seconds."""
    if not runs:
        return []
    return ["", *_table(["Run", "Arm", "Throughput", "Per step", "Status", "Seconds"],
                        [[r.get("run"), r.get("arm"), _num(r.get("throughput")),
                          ", ".join(str(_num(v)) for v in r.get("steps") or []) or UNKNOWN, r.get("status"),
                          r.get("seconds")] for r in runs])]


def rebuild_markdown(result: dict[str, Any]) -> list[str]:
    """The report.md section: the verdict of the rebuild and the first differing paths per layer."""
    out = ["", "### Rebuild check (`builder rebuild --check`)", "",
           f"{result['status']}: report {result['report']['manifest_digest']}, "
           f"rebuild {result['rebuild']['manifest_digest']}"]
    if result.get("log"):
        out += ["", f"The rebuild's build log: `{result['log']}`"]
    for layer in result.get("layers", []):
        out += ["", f"- layer {layer['index']}: {layer['files']} paths differ"]
        out += [f"  - `{e['path']}` {e['change']} {', '.join(e.get('fields', {}))}" for e in layer["entries"][:20]]
    return out


def cluster_markdown(report: Report) -> list[str]:
    """Where the gates ran when they mounted a .sqsh (a cluster): per node what it saw of the image, then Slurm's
    record of every step, then per gate and node the processes the census saw and the ones that recorded."""
    facts = report.acceptance.where if report.acceptance else None
    if not isinstance(facts, SlurmFacts) or facts.sqsh is None:
        return []
    layout = facts.layout.get("nodes", 1)
    out = ["", "### Cluster acceptance", "",
           f"{facts.engine}; cluster `{facts.cluster}`, partition `{facts.partition}`, job {facts.job_id}, "
           f"{len(facts.nodes)} node(s), recipe layout: {layout} node(s). `.sqsh` `{facts.sqsh.path}`, recorded "
           f"sha256 `{facts.sqsh.sha256}`. Limits applied: each gate "
           f"{', '.join(f'{g} {s} s' for g, s in facts.limits.gate_timeout_s.items())}; allocation "
           f"{facts.limits.allocation_s} s (cap {facts.limits.allocation_limit_s or 'none'}).",
           "", "Isolation actually had: " + "; ".join(f"{k}: {v}" for k, v in facts.isolation.items()) + ".", ""]
    out += _table(["Node", "sha256 seen", "Mounted file", "Staging", "Check", "GPUs"],
                  [[n.name, _code((n.sqsh_sha256 or "")[:16]), _code(n.sqsh_path or "-"), n.staged or "shared file",
                    f"{n.check.get('seconds')} s, step {n.check.get('step')}", n.gpus or "none"] for n in facts.nodes])
    for gate in report.gates:  # what a node's own environment set for the recipe (a site prolog, ...)
        for rank in gate.evidence.ranks or []:
            node_env = ((rank.get("evidence") or {}).get("run") or {}).get("node_env") if isinstance(rank, dict) else None
            if node_env:
                out.append(f"- {gate.name}: node {rank.get('node')} set " + ", ".join(
                    f"`{k}={v}`" for k, v in sorted(node_env.items())) + " (its own environment won over the arm's)")
    rows = [[label, f.get("job_id"), _code(f.get("step") or "-"), f.get("node"), f.get("state"), f.get("exit_code"),
             f.get("seconds")] for label, f in facts.steps() if f.get("step") or f.get("job_id")]
    out += [""] + _table(["Gate", "Job", "Step", "Node(s)", "Slurm state", "Exit code", "Seconds"], rows)
    return out


def jit_markdown(gates: list[GateResult]) -> list[str]:
    """Per gate, each compile-cache entry and where it came from: the node-local cache (this image, commits, GPU
    architecture, rank), the image, compiled or changed during the run."""
    rows = []
    for gate in gates:
        jit = gate.evidence.jit if isinstance(gate.evidence.jit, dict) else {}
        for entry in jit.get("entries") or []:
            if isinstance(entry, dict):
                rows.append([gate.name, entry.get("kernel") or _code(str(entry.get("file") or "")[-80:]),
                             entry.get("compiler"), entry.get("origin")])
    return ["", "#### JIT kernels per gate", ""] + _table(["Gate", "Kernel or file", "Compiler", "Origin"], rows) \
        if rows else []


def _count(value: Any) -> int:
    return len(value) if isinstance(value, (list, dict)) else int(value or 0) if isinstance(value, int) else 0


def census_markdown(gates: list[GateResult]) -> list[str]:
    """Per gate and node: the processes the census saw, those that recorded, and those that did not."""
    rows = []
    for gate in gates:
        census = gate.evidence.census if isinstance(gate.evidence.census, dict) else {}
        for node, seen in sorted((census.get("nodes") or {}).items()):
            if not isinstance(seen, dict):
                continue
            missing = [p for p in seen.get("unrecorded") or [] if isinstance(p, dict)]
            every = seen.get("seen")
            python = [p for p in every if isinstance(p, dict) and p.get("python")] if isinstance(every, list) else []
            rows.append([gate.name, node, _count(seen.get("seen")), _count(seen.get("recorded")),
                         "; ".join(f"{p.get('pid')} {p.get('why') or 'python'}" for p in python[:6]) or "none",
                         _looks(census.get("fanotify")),
                         "; ".join(f"{p.get('pid')} {p.get('exe')} ({_seen_by(p)})" for p in missing[:3]) or "none"])
    return ["", "#### Processes per gate and node (census)", "",
            "Why a process counts as an interpreter: identity (an interpreter of the image, by device and inode or"
            " sha256), elf (carries the Python runtime), loader (the program the dynamic loader mapped), libpython"
            " (maps one), name (python*). Looks: the poll, and under Docker the census container's fanotify reader"
            " (every exec, however short); poll only: a process shorter than the floor may be missed.", ""] + _table(
        ["Gate", "Node", "Seen", "Recorded", "Interpreters (why)", "Looks", "Unrecorded"], rows) if rows else []


def _looks(fanotify: dict[str, Any] | None) -> str:
    """How the census looked: "poll + fanotify", or "poll only" and why."""
    if not isinstance(fanotify, dict):
        return "poll only"
    return "poll + fanotify" if fanotify.get("state") == "on" else f"poll only ({fanotify.get('why') or 'no reader'})"


def _seen_by(row: dict[str, Any]) -> str:
    return f"{row.get('class')}, seen by {row['source']}" if row.get("source") else str(row.get("class"))


def sqsh_markdown(report: Report) -> list[str]:
    """The enroot .sqsh next to the registry digest, under the SHA tag (builder/release/sqsh.py)."""
    s = report.sqsh
    if s is None:
        return []
    smoke = f"provenance {s.smoke.get('status')}: {s.smoke.get('reason')}"
    return ["", "### Cluster image (enroot .sqsh)", ""] + _table(
        ["SHA tag", "Registry digest", ".sqsh sha256", "Size", "Compression", "Equivalence", "Smoke", "File"],
        [[_code(s.tag), _code(s.registry_digest), _code(s.sha256), f"{s.size / 1e6:.1f} MB", _code(s.compression),
          f"{s.equivalence} ({s.entries} paths, {s.files} files)", smoke, _code(s.path)]])


# ---------------------------------------------------------------- junit


def to_junit(report: Report) -> str:
    """junit.xml: <testsuites> with one <testsuite> per suite of results.suites (acceptance: the gates; placement:
    the .sqsh smoke), the same cases as ctrf.json."""
    listed = results.suites(report)
    every = [c for cases in listed.values() for c in cases]

    def counts(cases: list[results.Case]) -> dict[str, str]:
        return {"tests": str(len(cases)), "failures": str(sum(c.status == "fail" for c in cases)),
                "errors": str(sum(c.status == "inconclusive" for c in cases)),
                "skipped": str(sum(c.status == "not_run" for c in cases))}

    totals = {k: v for k, v in counts(every).items() if k != "skipped"}  # Jenkins' JUnit XSD: no skipped up here
    root = ET.Element("testsuites", {"name": report.name, **totals})
    for name, cases in listed.items():
        suite = ET.SubElement(root, "testsuite", {"name": name, **counts(cases)})
        props = ET.SubElement(suite, "properties")
        for key, value in (("verdict", report.verdict), ("image_id", report.image_id), ("name", report.name)):
            ET.SubElement(props, "property", name=key, value=value)
        for key in ("sha256", "size", "compression", "registry_digest", "tag") if name == results.PLACEMENT else ():
            ET.SubElement(props, "property", name=f"sqsh_{key}", value=str(getattr(report.sqsh, key)))
        for c in cases:
            case = ET.SubElement(suite, "testcase", classname=name, name=c.name)
            if c.status == "fail":
                ET.SubElement(case, "failure", message=c.reason or "failed", type="fail").text = c.detail
            elif c.status == "inconclusive":
                ET.SubElement(case, "error", message=c.reason or "inconclusive", type="inconclusive").text = c.detail
            elif c.status == "not_run":
                ET.SubElement(case, "skipped", message=c.reason or "not run")
            else:
                ET.SubElement(case, "system-out").text = c.detail
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# ---------------------------------------------------------------- files


def _atomic_write(path: Path, text: str) -> None:
    with fs.atomic_path(path) as tmp:
        tmp.write_text(text)
        os.chmod(tmp, 0o644)


LOGS_DIR = "logs"


def log_file(gate: str, rank: str) -> str:
    """A rank's log in the run directory: logs/<gate>/<rank>.log ("rank1 n2" -> rank1-n2.log)."""
    return f"{LOGS_DIR}/{re.sub(r'[^A-Za-z0-9_.-]+', '-', gate)}/{re.sub(r'[^A-Za-z0-9_.-]+', '-', rank)}.log"


def with_rank_log_files(report: Report) -> tuple[Report, dict[str, str]]:
    """The report with each rank's log (evidence.rank_logs) replaced by its file's path, and the files to write
    (path -> text). A path already there (a report written again) stays."""
    files: dict[str, str] = {}

    def split(gates: list[GateResult]) -> list[GateResult]:
        out = []
        for gate in gates:
            logs = gate.evidence.rank_logs
            if not logs or all(v == log_file(gate.name, k) for k, v in logs.items()):
                out.append(gate)
                continue
            paths = {rank: log_file(gate.name, rank) for rank in logs}
            files.update({paths[rank]: text for rank, text in logs.items() if text != paths[rank]})
            evidence = Evidence.model_validate({**gate.evidence.as_dict(), "rank_logs": paths})
            out.append(gate.model_copy(update={"evidence": evidence}))
        return out

    update: dict[str, Any] = {"gates": split(report.gates)}
    if report.acceptance is not None:
        update["acceptance"] = report.acceptance.model_copy(update={"gates": split(report.acceptance.gates)})
    return (report.model_copy(update=update), files) if files else (report, {})


def rank_logs_markdown(gates: list[GateResult]) -> list[str]:
    """Per gate that ran on several ranks: a link to each rank's log, kept beside the report."""
    out = [f"- {g.name}: " + ", ".join(f"[{rank}]({path})" for rank, path in g.evidence.rank_logs.items())
           for g in gates if g.evidence.rank_logs]
    return ["", "Rank logs (every rank's stderr then stdout):", "", *out] if out else []


def with_replay_files(report: Report) -> tuple[Report, dict[str, ReplaySummary]]:
    """The report pointing at replay/<gate>.json for each bundle of a difference, and those bundles."""
    gates, bundles = replay.split(report.gates)
    if not bundles:
        return report, {}
    update: dict[str, Any] = {"gates": gates}
    if report.acceptance is not None:
        update["acceptance"] = report.acceptance.model_copy(update={"gates": replay.split(report.acceptance.gates)[0]})
    return report.model_copy(update=update), bundles


def write(report: Report, outdir: str | Path) -> dict[str, Path]:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)

    paths = {"json": outdir / "report.json", "md": outdir / "report.md", "junit": outdir / "junit.xml",
             "ctrf": outdir / "ctrf.json"}
    fs.sweep_parts(outdir)  # what a killed run left, once for the four files
    report, bundles = with_replay_files(report)
    report, logs = with_rank_log_files(report)
    for name, text in logs.items():
        paths[name] = outdir / name
        paths[name].parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(paths[name], text)
    for gate, bundle in bundles.items():
        paths[f"replay_{gate}"] = outdir / replay.bundle_file(gate)
        paths[f"replay_{gate}"].parent.mkdir(exist_ok=True)
        _atomic_write(paths[f"replay_{gate}"], json.dumps(bundle, indent=1) + "\n")
    _atomic_write(paths["json"], report.model_dump_json(indent=2) + "\n")
    _atomic_write(paths["md"], to_markdown(report))
    _atomic_write(paths["junit"], to_junit(report))
    _atomic_write(paths["ctrf"], json.dumps(to_ctrf(report), indent=2) + "\n")
    return paths


REPORT_MAX_BYTES = 32 * 1024 * 1024


def load(path: str | Path) -> Report:
    """report.json: a regular UTF-8 file (builder.pins.inputfile), then the Report model; BadInput otherwise."""

    text = read_text(path, "report", REPORT_MAX_BYTES)
    try:
        return Report.model_validate_json(text)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(map(str, err["loc"]))
        raise BadInput(clip(f"{path}: not a report: {where + ': ' if where else ''}{err['msg']}")) from None
