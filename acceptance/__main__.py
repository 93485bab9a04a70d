"""`python -m acceptance gate <name> --settings <json>`: run one gate, print its GateResult JSON as the last
stdout line. The recipe's own output goes to stderr."""
import argparse
import json
import math
import os
import shutil
import sys
import time
import traceback
from typing import Any

from acceptance.defaults import GATES, METRICS

WEIGHT_GATES = ("zero_update", "rl_step")


def run_gate(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    if name == "replay":  # `builder replay` through the same door as the gates (settings: {"bundle": {...}})
        from acceptance import replay as again

        return again.as_gate(settings)
    if int((settings.get("layout") or {}).get("nodes") or 1) > 1:
        from acceptance.recipe import Layout

        if Layout(settings, name).role == "rollout":
            return rollout_role(name, settings)
    start = time.time()
    log = ""
    jit_dirs = jit_before = None
    if name != "provenance":  # a recipe gate: what the JIT compilers add to the caches during the run
        from acceptance import jitcache
        from acceptance.provenance import cache_dirs

        jit_dirs = cache_dirs(settings)
        jit_before = jitcache.listing(jit_dirs)
    if name == "provenance":
        from acceptance import provenance

        status, reason, evidence = provenance.check(settings)
    elif name == "performance":
        from acceptance import decide, recipe

        arm = settings.get("arm")
        if arm not in ("aligned", "control"):
            raise ValueError(f"performance: settings.arm must be 'aligned' or 'control', got {arm!r}")
        metric = (settings.get("performance") or {}).get("metric") or {**METRICS, **(settings.get("metrics") or {})}["throughput"]
        run, facts, log = recipe.run(settings, "rl_step" if arm == "aligned" else "control")
        status, reason, evidence = decide.performance_run(run, int(settings["steps"]), metric, arm)
        evidence["run"] = facts
        status, reason = by_process(settings, facts, status, reason, evidence)
    else:
        from acceptance import decide, recipe, replay

        given = settings
        capture = os.path.join(settings.get("work_dir", "/tmp/acceptance"), "replay", name)
        shutil.rmtree(capture, ignore_errors=True)
        settings = {**settings, "env": {**(settings.get("env") or {}), replay.ENV: capture}}
        metrics = {**METRICS, **(settings.get("metrics") or {})}
        steps = int(settings["steps"])
        mode = settings.get("weights", "metrics") if name in WEIGHT_GATES else None
        if mode == "checkpoint":
            from acceptance import checkpoint

            checkpoint.prepare(settings, name)
            first = checkpoint.initial(settings)
            run, facts, log = recipe.run(settings, name, checkpoint.overrides(settings, name))
            hashed = time.time()
            weights = {"mode": mode, "may_stay": settings["checkpoint"].get("may_stay") or [],
                       "shots": [first, *checkpoint.steps(settings, name, steps)]}
            facts["hash_seconds"] = round(time.time() - hashed, 3)
        else:
            run, facts, log = recipe.run(settings, name)
            weights = {"mode": mode}
        status, reason, evidence = decide.DECISIONS[name](run, steps, metrics, weights)
        evidence["run"] = facts
        status, reason = by_process(settings, facts, status, reason, evidence)
        arm_env, lr = recipe.arm(given, name)
        found = replay.bundle(name, capture, given, arm_env, lr)
        if found is not None:  # a recipe that writes no capture gets no bundle
            evidence["replay"] = found
    if jit_dirs is not None and jit_before is not None:
        evidence["jit"] = jitcache.compiled(jit_dirs, jit_before, bool((settings.get("jit_cache") or {}).get("dir")))
    if name != "provenance":
        from acceptance.hook import node_name

        evidence["node"] = node_name()
    evidence["seconds"] = round(time.time() - start, 3)
    return {"name": name, "status": status, "reason": reason, "evidence": evidence, "log": log}


def rollout_role(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The rollout node's side of a gate: the provenance check of its own container, or the rollout server under
    the census until the trainer's stop. Its line: {name, role: "rollout", status, reason, evidence: {node, census,
    processes, process_failures, run, seconds}, log}."""
    from acceptance.hook import node_name

    start = time.time()
    log = ""
    if name == "provenance":
        from acceptance import provenance

        status, reason, evidence = provenance.check(settings)
    else:
        from acceptance import recipe

        code, facts, log = recipe.serve(settings, name)
        status, reason = ("pass", "the rollout server served the trainer and ended (exit 0)") if code == 0 else (
            "fail", f"the rollout server exited with {code}: {facts.get('error')}")
        evidence = {"run": facts}
        status, reason = by_process(settings, facts, status, reason, evidence)
    evidence["node"] = node_name()
    evidence["seconds"] = round(time.time() - start, 3)
    return {"name": name, "role": "rollout", "status": status, "reason": reason, "evidence": evidence, "log": log}


def by_process(settings: dict[str, Any], facts: dict[str, Any], status: str, reason: str,
               evidence: dict[str, Any]) -> tuple[str, str]:
    """The recipe gate's verdict after the per-process evidence: any process that ran something the manifest
    does not list fails the gate, whatever the metrics said, and so does any process the gate's census saw run
    an interpreter or touch a component without leaving a record (the process lists go into the evidence)."""
    from acceptance import elf, processes

    census = facts.pop("census", None)  # the raw census (recipe.run): judged here, kept as evidence["census"]
    if settings.get("process_records") is False:  # benchmarks/gpu_gates.py: a venv, not an image
        evidence["processes"] = "off (settings.process_records: false)"
        return status, reason
    if not facts.get("processes_dir"):
        return status, reason  # the recipe did not start
    lost = {r["record"] for r in (census or {}).get("records") or [] if r.get("lost")}
    failures, evidence["processes"] = processes.check(facts["processes_dir"], settings, lost)
    elf.library_deps(evidence["processes"])  # each owned library's DT_NEEDED and CUDA targets, read here
    if census is not None:
        missing, evidence["census"] = processes.compare(census, evidence["processes"])
        failures += missing
    elif settings.get("census") is False:  # benchmarks: the gate's cost without the census
        evidence["census"] = "off (settings.census: false)"
    evidence["process_failures"] = failures[:20]
    if not failures:
        return status, reason
    more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
    also = f"; the run itself: {reason}" if status == "fail" else ""
    return "fail", f"per-process provenance: {failures[0]}{more}{also}"


def plain(value: object) -> object:
    """JSON-safe copy: NaN and infinities become strings ('nan', 'inf') so every reader can load the line."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m acceptance")
    sub = parser.add_subparsers(dest="command", required=True)
    gate = sub.add_parser("gate", help="run one gate")
    gate.add_argument("name", choices=(*GATES, "replay"))
    gate.add_argument("--settings", required=True, help="settings as JSON, or @file")
    again = sub.add_parser("replay", help="replay a gate's bundle (acceptance/replay.py)")
    again.add_argument("--bundle", required=True, help="the bundle's JSON file")
    args = parser.parse_args(argv)
    if args.command == "replay":
        from acceptance import replay

        return replay.main(args.bundle)
    text = args.settings
    if text.startswith("@"):
        with open(text[1:]) as fh:
            text = fh.read()
    try:
        result = run_gate(args.name, json.loads(text))
    except Exception as err:  # noqa: BLE001 - a crashing gate is a failed gate, with its traceback
        tail = traceback.format_exc()[-4000:]
        result = {"name": args.name, "status": "fail", "reason": f"gate crashed: {err.__class__.__name__}: {err}",
                  "evidence": {}, "log": tail}
    sys.stdout.flush()
    print(json.dumps(plain(result), default=str, allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
