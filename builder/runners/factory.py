"""The one place that turns an `AcceptancePlan`'s place into a GateRunner: the Docker engine of the build (or
another engine, pulled by digest), or a Slurm cluster from the candidate's .sqsh. The use cases call `gate_image` and
never learn which one ran; the runner describes itself in the report's typed `RunnerFacts` (`DockerFacts` or `SlurmFacts`)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from builder.core import log
from builder.core.imageref import by_digest
from builder.core.options import Settings
from builder.core.records import AcceptanceResult, EngineFacts, GateResult, Pulled, Report, SlurmFacts
from builder.engine import client as engine
from builder.engine import staging
from builder.engine.client import Client
from builder.gating import gates
from builder.gating.plan import AcceptancePlan, DockerPlace, Flags, SlurmPlace
from builder.gating.plan import make as make_plan
from builder.gating.runner import GateRunner
from builder.gating.settings import ReplayCall
from builder.pins.model import Pins
from builder.runners import docker_runner
from builder.runners import slurm_candidate as cluster


def _docker(place: DockerPlace, pins: Pins, image: str, expected_id: str | None, settings: Settings,
            client: Client, run_id: str | None) -> tuple[GateRunner, str, Pulled | None]:
    pulled = None
    if place.engine_url:  # another engine: its own client, for this acceptance only
        client = engine.connect(replace(settings, docker_host=place.engine_url))
    if by_digest(image) is not None:
        who = engine.facts(client)
        pulled = staging.pull(client, image, expected_id, settings)
        pulled = pulled.model_copy(update={"engine": EngineFacts(**who, url=place.engine_url or "DOCKER_HOST")})
        log.info(f"acceptance engine {who['host']} ({who['id']}, Docker {who['version']}, gpus {who['gpus']})")
        image = pulled.image_id
    runner, full_id = docker_runner.for_image(client, pins, image, run_id)
    return runner, full_id, pulled


def open_runner(plan: AcceptancePlan, pins: Pins, image: str, expected_id: str | None, settings: Settings,
                client: Client, run_id: str | None = None) -> tuple[GateRunner, str, Pulled | None]:
    """(the runner, the image ID its gates run, what was pulled by digest) for the plan's place. `run_id` labels
    a Docker runner's containers (default: a fresh one)."""
    if isinstance(plan.place, SlurmPlace):
        return cluster.open_slurm_runner(plan, pins, image, expected_id, settings, client)
    return _docker(plan.place, pins, image, expected_id, settings, client, run_id)


def gate_image(plan: AcceptancePlan, pins: Pins, image: str, expected_id: str | None, settings: Settings,
               client: Client, run_id: str | None = None) -> AcceptanceResult:
    """Open the plan's runner and run its gates (the gate loop, builder/gating/gates.py); the runner is closed at
    the end, also on error or interrupt."""
    runner, image_id, pulled = open_runner(plan, pins, image, expected_id, settings, client, run_id)
    return gates.run_gates(runner, image_id, plan, pins, pulled)


def gate_local_image(image_id: str, pins: Pins, settings: Settings, gates: Sequence[str] | None = None,
                     timeout_s: int | None = None, run_id: str | None = None) -> AcceptanceResult:
    """The selected gates (default: the pins' required gates) of a local image on the settings' engine, through
    the same door (tests, benchmarks); every container labelled io.truepolicy.acceptance=<run_id>."""
    plan = make_plan(pins, Flags(image=image_id, gates=list(gates or ()), timeout_s=timeout_s), settings).acceptance
    return gate_image(plan, pins, image_id, None, settings, engine.connect(settings), run_id)


def new_exports(plan: AcceptancePlan, image_id: str) -> list[Path]:
    """The files the plan's runner would make for this image that are not there yet (a Slurm runner's candidate
    .sqsh), for a caller that removes what it made at its end (bisect)."""
    if isinstance(plan.place, SlurmPlace) and not cluster.sqsh_path(plan.place, image_id).exists():
        return [cluster.sqsh_path(plan.place, image_id)]
    return []


def replay_plan(report: Report, pins: Pins, settings: Settings, slurm: bool | None) -> AcceptancePlan:
    """Where a replay runs: where the report's gates ran (a cluster acceptance mounted a .sqsh), unless `slurm`
    says otherwise; one replay step with the pins' per-gate limit."""
    facts = report.acceptance.where if report.acceptance else None
    on_cluster = slurm if slurm is not None else isinstance(facts, SlurmFacts) and facts.sqsh is not None
    flags = Flags(image=report.image_id, gates=["provenance"], slurm=on_cluster)
    return make_plan(pins, flags, settings).acceptance


def replay(plan: AcceptancePlan, pins: Pins, image: str, settings: Settings, client: Client,
           bundle: dict[str, Any]) -> tuple[GateResult, str]:
    """One `replay` step through the plan's runner (the in-image `python -m acceptance gate replay`): its result
    and the image ID it ran. A Docker replay's container carries the settings' run ID (BUILDER_RUN_ID) and is
    removed at the end, also on error or interrupt."""
    runner, image_id, _ = open_runner(plan, pins, image, None, settings, client, settings.run_id)
    limit = plan.gate("provenance").timeout_s
    try:
        result, _ = runner.run(ReplayCall(MappingProxyType(bundle), limit), limit)
    finally:
        runner.close()
    return result, image_id
