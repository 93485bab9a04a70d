"""Host side of acceptance: one fresh container per gate, from the image ID, with no network, no host
sources, empty tmpfs caches and read-only mounts only where the pins ask. Results come back as the
gate's GateResult JSON (last stdout line); a hang is killed at the timeout; containers are always removed."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from acceptance import perf as perf_rule
from builder.core import log
from builder.core.constants import CACHE_DIR as CACHE
from builder.core.constants import CACHE_ENV, GATES, LABEL_PREFIX, MANIFEST
from builder.core.errors import BadInput, InfraError
from builder.core.options import Settings
from builder.core.records import AcceptanceResult, EngineFacts, GateResult
from builder.engine import client as engine
from builder.engine import staging
from builder.engine.client import Client
from builder.pins.model import TIMEOUT_S, Pins, check_mounts

LABEL = f"{LABEL_PREFIX}.acceptance"          # value: the run id; on every acceptance container
TMPFS = {CACHE: "rw,exec,nosuid,nodev,size=2g", "/tmp": "rw,exec,nosuid,nodev,size=1g"}
TAIL = 6000


def gate_settings(pins: Pins, gate: str) -> dict[str, Any]:
    """What the in-image runner needs: the recipe, its arms, the steps/lr keys and the metric names."""
    acc, recipe = pins.acceptance, pins.recipe
    return {"gate": gate, "entry": list(recipe.entry), "overrides": dict(recipe.overrides), "env": dict(recipe.env),
            "aligned_env": dict(recipe.aligned_env), "control_env": dict(recipe.control_env),
            "steps": acc.steps, "steps_key": acc.steps_key, "lr_key": acc.lr_key, "lr": pins.rl_lr(),
            "logger_key": "trainer.logger", "logger": ["console", "file"],
            "metrics": acc.metrics.model_dump(), "cache_dir": CACHE, "work_dir": "/tmp/acceptance",
            "manifest": MANIFEST, "weights": acc.weights, "checkpoint": checkpoint_settings(pins),
            "performance": acc.performance.model_dump() if acc.performance else None}


def checkpoint_settings(pins: Pins) -> dict[str, Any] | None:
    """Checkpoint mode: the recipe's save options, where it saves, the step layout and the model it loads."""
    ckpt = pins.acceptance.checkpoint
    if pins.acceptance.weights != "checkpoint" or ckpt is None:
        return None
    model_path = pins.recipe.overrides.get(ckpt.model_path_key) if ckpt.model_path_key else None
    return {"overrides": dict(ckpt.overrides), "dir_key": ckpt.dir_key, "dir": ckpt.dir, "layout": ckpt.layout,
            "model_path": str(model_path) if model_path is not None else None, "may_stay": list(ckpt.may_stay)}


def _container_spec(pins: Pins, image_id: str, gate: str, settings: dict[str, Any], run_id: str) -> dict[str, Any]:
    import docker  # lazy: docker SDK, slow to import; start-up

    mounts = [docker.types.Mount(target=m.target, source=m.source, type="bind", read_only=True)
              for m in pins.acceptance.mounts]
    ckpt = pins.acceptance.checkpoint
    if pins.acceptance.weights == "checkpoint" and ckpt is not None and ckpt.scratch:
        # the only writable mount: where the recipe saves its checkpoints (pins: acceptance.checkpoint.scratch)
        mounts.append(docker.types.Mount(target=ckpt.dir, source=ckpt.scratch, type="bind", read_only=False))
    spec: dict[str, Any] = {"image": image_id,
            "command": [pins.base.python_bin, "-m", "acceptance", "gate", gate, "--settings", json.dumps(settings)],
            "environment": dict(CACHE_ENV), "network_mode": "none", "tmpfs": dict(TMPFS), "mounts": mounts,
            "working_dir": "/tmp", "labels": {LABEL: run_id, f"{LABEL}.gate": gate, f"{LABEL}.image": image_id,
                       **engine.owner_labels()},
            "detach": True}
    if pins.acceptance.gpus > 0:
        spec["device_requests"] = [docker.types.DeviceRequest(count=pins.acceptance.gpus, capabilities=[["gpu"]])]
    return spec


def _facts(container: Any) -> dict[str, Any]:
    attrs = container.attrs
    state, host = attrs.get("State", {}), attrs.get("HostConfig", {})
    return {"id": attrs.get("Id"), "name": attrs.get("Name", "").lstrip("/"), "image": attrs.get("Image"),
            "network": host.get("NetworkMode"),
            "networks": sorted((attrs.get("NetworkSettings", {}).get("Networks") or {}).keys()),
            "mounts": [{"source": m.get("Source"), "target": m.get("Destination"), "rw": m.get("RW")}
                       for m in attrs.get("Mounts") or []],
            "tmpfs": host.get("Tmpfs") or {}, "env": attrs.get("Config", {}).get("Env") or [],
            "device_requests": host.get("DeviceRequests") or [],
            "started": state.get("StartedAt"), "finished": state.get("FinishedAt"),
            "exit_code": state.get("ExitCode"), "oom_killed": state.get("OOMKilled")}


def _parse(stdout: str, gate: str) -> dict[str, Any] | None:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("name") == gate else None


def run_gate(client: Client, pins: Pins, image_id: str, gate: str, timeout_s: int,
             run_id: str, settings: dict[str, Any] | None = None) -> tuple[GateResult, dict[str, Any]]:
    """Run one gate in a new container; always remove it (also on timeout and Ctrl-C)."""
    import docker  # lazy: docker SDK, slow to import; start-up
    import requests  # lazy: slow to import; start-up

    settings = settings or gate_settings(pins, gate)
    container = None
    try:
        try:
            container = client.containers.create(**_container_spec(pins, image_id, gate, settings, run_id))
            container.start()
        except docker.errors.APIError as err:
            raise InfraError(f"docker engine: cannot start the {gate} container: {err}") from None
        timed_out = False
        try:
            container.wait(timeout=timeout_s)
        except (requests.exceptions.RequestException, ConnectionError):
            timed_out = True
            try:
                container.kill()
                container.wait(timeout=60)
            except docker.errors.APIError:
                pass  # it stopped on its own meanwhile
        container.reload()
        facts = _facts(container)
        stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
        tail = stderr[-TAIL:]
        if timed_out:
            facts["timed_out"] = True
            return GateResult(name=gate, status="fail", reason=f"timed out after {timeout_s} s (container killed)",
                              evidence={"timeout_s": timeout_s}, log=(stderr + stdout)[-TAIL:]), facts
        data = _parse(stdout, gate)
        if data is None:
            return GateResult(name=gate, status="fail",
                              reason=f"gate exited with status {facts['exit_code']} without a result line",
                              evidence={"exit_code": facts["exit_code"]}, log=(stderr + stdout)[-TAIL:]), facts
        data["log"] = data.get("log") or tail
        return GateResult.model_validate({k: data.get(k) for k in ("name", "status", "reason", "evidence", "log")}), facts
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


def leftover_containers(client: Client, run_id: str | None = None) -> list[Any]:
    """Acceptance containers still present (all runs, or one run)."""
    label = f"{LABEL}={run_id}" if run_id else LABEL
    found: list[Any] = client.containers.list(all=True, filters={"label": label})
    return found


def _image_id(client: Client, image: str) -> str:
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        return str(client.images.get(image).id)
    except docker.errors.ImageNotFound:
        raise BadInput(f"image {image}: not found in the Docker engine") from None


def run_performance(client: Client, pins: Pins, image_id: str, timeout_s: int,
                    run_id: str) -> tuple[GateResult, dict[str, Any]]:
    """The performance gate: `repeats` runs of each arm, interleaved (aligned, control, aligned, ...), each in
    a fresh container; a run that fails fails the gate, otherwise acceptance.perf decides on the medians."""
    perf = pins.acceptance.performance
    if perf is None:
        return GateResult(name="performance", status="not_run", reason="no acceptance.performance in the pins"), {}
    metric = pins.acceptance.performance_metric()
    runs: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"runs": []}
    for index in range(1, perf.repeats + 1):
        for arm in ("aligned", "control"):
            settings = {**gate_settings(pins, "performance"), "arm": arm, "steps": perf.steps or pins.acceptance.steps}
            start = time.monotonic()
            result, fact = run_gate(client, pins, image_id, "performance", timeout_s, run_id, settings)
            seconds = round(time.monotonic() - start, 3)
            runs.append({"run": index, "arm": arm, "status": result.status, "throughput": result.evidence.get(
                "throughput"), "steps": result.evidence.get("throughput_steps"), "seconds": seconds})
            facts["runs"].append({**fact, "arm": arm, "run": index, "seconds": seconds})
            log.info(f"  performance {arm} run {index}: {result.status}: {result.reason}")
            if result.status != "pass":
                failed = {"metric": metric, "runs": runs, "failed_run": result.evidence}
                return GateResult(name="performance", status="fail", reason=f"{arm} run {index}: {result.reason}",
                                  evidence=failed, log=result.log), facts
    status, reason, evidence = perf_rule.decide([r for r in runs if r["arm"] == "aligned"],
                                                [r for r in runs if r["arm"] == "control"],
                                                perf.min_ratio, perf.max_spread, metric)
    evidence.update({"runs": runs, "repeats": perf.repeats, "min_ratio_reason": perf.reason})
    return GateResult(name="performance", status=status, reason=reason, evidence=evidence), facts


def throughput(gates: list[GateResult], metric: str) -> dict[str, Any]:
    """Rollout throughput of the aligned arm and the control arm, and their ratio: the performance gate's
    medians and every run when it ran, else the rl_step and control gates' single runs."""
    by_name = {g.name: g for g in gates}
    perf = by_name.get("performance")
    if perf is not None and isinstance(perf.evidence.get("aligned"), dict):
        ev = perf.evidence
        return {"metric": ev.get("metric", metric), "aligned": ev["aligned"].get("median"),
                "control": (ev.get("control") or {}).get("median"), "ratio": ev.get("ratio"),
                "source": "performance gate: medians", "min_ratio": ev.get("min_ratio"),
                "max_spread": ev.get("max_spread"), "runs": ev.get("runs") or []}
    aligned = by_name["rl_step"].evidence.get("throughput") if "rl_step" in by_name else None
    control = by_name["control"].evidence.get("throughput") if "control" in by_name else None
    numbers = all(isinstance(v, (int, float)) for v in (aligned, control))
    ratio = aligned / control if numbers and control else None
    return {"metric": metric, "aligned": aligned, "control": control, "ratio": ratio}


def accept(image_id: str, pins: Pins, settings: Settings, gates: Sequence[str] | None = None,
           timeout_s: int | None = None, run_id: str | None = None) -> AcceptanceResult:
    """Run the selected gates (default all) in fresh containers; unselected ones are not_run.
    Every container carries the label io.truepolicy.acceptance=<run_id> (random unless given)."""
    selected = list(gates) if gates else list(GATES)
    unknown = [g for g in selected if g not in GATES]
    if unknown:
        raise BadInput(f"--gate: expected one of {', '.join(GATES)}, got {unknown[0]!r}")
    if timeout_s is not None and not TIMEOUT_S[0] <= timeout_s <= TIMEOUT_S[1]:
        raise BadInput(f"--timeout: expected seconds in {TIMEOUT_S[0]}..{TIMEOUT_S[1]}, got {timeout_s!r}")
    client = engine.connect(settings)
    check_mounts(pins, client.info().get("DockerRootDir"))  # the engine's own data root, wherever it is
    full_id = _image_id(client, image_id)
    timeout = timeout_s or pins.acceptance.timeout_s
    run_id = run_id or uuid.uuid4().hex[:12]
    results: list[GateResult] = []
    facts: dict[str, dict[str, Any]] = {}
    for gate in GATES:
        if gate not in selected:
            results.append(GateResult(name=gate, status="not_run", reason="not selected"))
            continue
        with log.step(f"gate {gate}"):
            start = time.monotonic()
            if gate == "performance":
                result, facts[gate] = run_performance(client, pins, full_id, timeout, run_id)
            else:
                result, facts[gate] = run_gate(client, pins, full_id, gate, timeout, run_id)
            facts[gate]["seconds"] = round(time.monotonic() - start, 3)
        log.info(f"  {gate}: {result.status}: {result.reason}")
        results.append(result)
    prov = next((g for g in results if g.name == "provenance" and g.status != "not_run"), None)
    environment = {"engine": client.version().get("Version")}
    if prov is not None:
        environment.update({"interpreter": prov.evidence.get("interpreter"),
                            "numeric_env": prov.evidence.get("environment"), "gpu": prov.evidence.get("gpu")})
    container = {"image_id": full_id, "run_id": run_id, "label": f"{LABEL}={run_id}", "network": "none",
                 "tmpfs": TMPFS, "env": CACHE_ENV, "mounts": [m.model_dump() for m in pins.acceptance.mounts],
                 "gpus": pins.acceptance.gpus, "timeout_s": timeout, "gates": facts,
                 "weights": pins.acceptance.weights, "checkpoint": checkpoint_settings(pins)}
    return AcceptanceResult(image_id=full_id, container=container, gates=results, environment=environment,
                            throughput=throughput(results, pins.acceptance.metrics.throughput))


def accept_staged(ref: str, pins: Any, expected_id: str | None, engine_url: str | None, gates: list[str] | None,
                  timeout_s: int | None, settings: Settings) -> AcceptanceResult:
    """Acceptance on exactly the bytes the registry serves: connect to the engine (default: DOCKER_HOST),
    pull by digest, check the image ID, run the gates there; the engine's facts go into `pulled`."""
    there = replace(settings, docker_host=engine_url) if engine_url else settings
    client = engine.connect(there)  # InfraError (exit 3) first
    who = engine.facts(client)
    pulled = staging.pull(client, ref, expected_id, there)
    log.info(f"acceptance engine {who['host']} ({who['id']}, Docker {who['version']}, gpus {who['gpus']})")
    result = accept(pulled.image_id, pins, there, gates=gates, timeout_s=timeout_s)
    result.pulled = pulled.model_copy(update={"engine": EngineFacts(**who, url=engine_url or "DOCKER_HOST")})
    return result


def performance_with(runner: Any, pins: Pins, timeout_s: int) -> tuple[GateResult, dict[str, Any]]:
    """The performance gate through a GateRunner: interleaved arms, each run a fresh container."""
    perf = pins.acceptance.performance
    if perf is None:
        return GateResult(name="performance", status="not_run", reason="no acceptance.performance in the pins"), {}
    metric = pins.acceptance.performance_metric()
    runs: list[dict[str, Any]] = []
    facts: dict[str, Any] = {"runs": []}
    for index in range(1, perf.repeats + 1):
        for arm in ("aligned", "control"):
            settings = {**gate_settings(pins, "performance"), "arm": arm, "steps": perf.steps or pins.acceptance.steps}
            start = time.monotonic()
            result, fact = runner.run("performance", settings, timeout_s)
            seconds = round(time.monotonic() - start, 3)
            runs.append({"run": index, "arm": arm, "status": result.status, "throughput": result.evidence.get(
                "throughput"), "steps": result.evidence.get("throughput_steps"), "seconds": seconds})
            facts["runs"].append({**fact, "arm": arm, "run": index, "seconds": seconds})
            log.info(f"  performance {arm} run {index}: {result.status}: {result.reason}")
            if result.status != "pass":
                failed = {"metric": metric, "runs": runs, "failed_run": result.evidence}
                return GateResult(name="performance",
                                  status="inconclusive" if result.status == "inconclusive" else "fail",
                                  reason=f"{arm} run {index}: {result.reason}",
                                  evidence=failed, log=result.log), facts
    status, reason, evidence = perf_rule.decide([r for r in runs if r["arm"] == "aligned"],
                                                [r for r in runs if r["arm"] == "control"],
                                                perf.min_ratio, perf.max_spread, metric)
    evidence.update({"runs": runs, "repeats": perf.repeats, "min_ratio_reason": perf.reason})
    return GateResult(name="performance", status=status, reason=reason, evidence=evidence), facts


def gate_runs(pins: Pins, gates: Sequence[str] | None) -> int:
    """How many containers the selected gates start (performance: 2 x repeats)."""
    selected = list(gates) if gates else list(GATES)
    perf = pins.acceptance.performance
    return sum(2 * perf.repeats if g == "performance" and perf else 1 for g in selected)


def accept_with(runner: Any, image_id: str, pins: Pins, gates: Sequence[str] | None = None,
                timeout_s: int | None = None, run_id: str | None = None) -> AcceptanceResult:
    """The gate loop over any GateRunner; the runner is closed at the end (also on interrupt)."""
    selected = list(gates) if gates else list(GATES)
    unknown = [g for g in selected if g not in GATES]
    if unknown:
        raise BadInput(f"--gate: expected one of {', '.join(GATES)}, got {unknown[0]!r}")
    timeout = timeout_s or pins.acceptance.timeout_s
    results: list[GateResult] = []
    facts: dict[str, dict[str, Any]] = {}
    try:
        for gate in GATES:
            if gate not in selected:
                results.append(GateResult(name=gate, status="not_run", reason="not selected"))
                continue
            with log.step(f"gate {gate}"):
                start = time.monotonic()
                if gate == "performance":
                    result, facts[gate] = performance_with(runner, pins, timeout)
                else:
                    result, facts[gate] = runner.run(gate, gate_settings(pins, gate), timeout)
                facts[gate]["seconds"] = round(time.monotonic() - start, 3)
            log.info(f"  {gate}: {result.status}: {result.reason}")
            results.append(result)
    finally:
        runner.close()
    described = runner.describe()
    prov = next((g for g in results if g.name == "provenance" and g.status != "not_run"), None)
    environment: dict[str, Any] = {"runner": runner.kind, "runtime": described.get("runtime"),
                                   "runtime_version": described.get("runtime_version")}
    if prov is not None:
        environment.update({"interpreter": prov.evidence.get("interpreter"),
                            "numeric_env": prov.evidence.get("environment"), "gpu": prov.evidence.get("gpu")})
    container = {"image_id": image_id, "run_id": run_id, "runner": described, "gpus": pins.acceptance.gpus,
                 "timeout_s": timeout, "gates": facts, "weights": pins.acceptance.weights,
                 "checkpoint": checkpoint_settings(pins)}
    return AcceptanceResult(image_id=image_id, container=container, gates=results, environment=environment,
                            throughput=throughput(results, pins.acceptance.metrics.throughput))
