"""The acceptance settings the gates run with: one frozen value read once from the pins (`GateSettings.of`) and
passed down the gate loop. The host reads its typed fields (steps, limits, nodes, the performance rule, the weight
mode, mounts); `wire(gate)` is the JSON the in-image suite reads (acceptance/__main__.py), whose keys never change:
images built before read them too.

A runner is handed one typed call (GateCall: the gate, its settings, a performance run's arm; ReplayCall: a replay
bundle) and the place it runs (Placement: the cache directory, the node layout, a node-local JIT cache); the call's
`wire(place)` is the one place their JSON is made, where it leaves the process as the gate's command or file."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from pydantic import JsonValue

from acceptance import perf as perf_rule
from builder.core.constants import CACHE_DIR, MANIFEST
from builder.pins.model import Mount, Pins

WORK_DIR = "/tmp/acceptance"


@dataclass(frozen=True)
class CheckpointSettings:
    """Checkpoint mode: the recipe's save options, where it saves, the step layout and the model it loads."""

    overrides: MappingProxyType[str, JsonValue]
    dir_key: str
    dir: str
    layout: str
    model_path: str | None
    may_stay: tuple[str, ...]

    def wire(self) -> dict[str, JsonValue]:
        return {"overrides": dict(self.overrides), "dir_key": self.dir_key, "dir": self.dir, "layout": self.layout,
                "model_path": self.model_path, "may_stay": list(self.may_stay)}


@dataclass(frozen=True)
class PerformanceSettings:
    """The performance gate: pairs of runs (aligned, control) from `min_pairs` to `repeats`, judged by `rule`."""

    repeats: int
    min_pairs: int
    steps: int
    metric: str
    reason: str
    rule: perf_rule.Rule
    spec: MappingProxyType[str, JsonValue]  # the pins' acceptance.performance, as the suite reads it


@dataclass(frozen=True)
class GateSettings:
    """What every gate of one acceptance runs with, from the pins once."""

    steps: int
    timeout_s: int
    nodes: int
    gpus: int
    weights: Literal["metrics", "checkpoint", "none"]
    throughput_metric: str             # acceptance.metrics.throughput: the arms' single-run throughput
    performance: PerformanceSettings | None
    checkpoint: CheckpointSettings | None
    mounts: tuple[Mount, ...]
    recipe: MappingProxyType[str, JsonValue]  # the recipe's part of the wire: entry, overrides, arms' env, keys

    @classmethod
    def of(cls, pins: Pins) -> GateSettings:
        acc, recipe = pins.acceptance, pins.recipe
        perf = acc.performance
        ckpt = acc.checkpoint if acc.weights == "checkpoint" else None
        model = recipe.overrides.get(ckpt.model_path_key) if ckpt is not None and ckpt.model_path_key else None
        return cls(
            steps=acc.steps, timeout_s=acc.timeout_s, nodes=acc.nodes, gpus=acc.gpus, weights=acc.weights,
            throughput_metric=acc.metrics.throughput, mounts=tuple(acc.mounts),
            performance=None if perf is None else PerformanceSettings(
                repeats=perf.repeats, min_pairs=perf.min_pairs, steps=perf.steps or acc.steps,
                metric=acc.performance_metric(), reason=perf.reason, rule=perf.rule(),
                spec=MappingProxyType(perf.model_dump())),
            checkpoint=None if ckpt is None else CheckpointSettings(
                overrides=MappingProxyType(dict(ckpt.overrides)), dir_key=ckpt.dir_key, dir=ckpt.dir,
                layout=ckpt.layout, may_stay=tuple(ckpt.may_stay), model_path=None if model is None else str(model)),
            recipe=MappingProxyType({
                "entry": list(recipe.entry), "overrides": dict(recipe.overrides), "env": dict(recipe.env),
                "aligned_env": dict(recipe.aligned_env), "control_env": dict(recipe.control_env),
                "steps_key": acc.steps_key, "lr_key": acc.lr_key, "lr": pins.rl_lr(),
                "metrics": acc.metrics.model_dump(),
                "rollout": recipe.rollout.model_dump() if recipe.rollout else None}))

    def wire(self, gate: str) -> dict[str, JsonValue]:
        """What the in-image runner reads for `gate`: the recipe, its arms, the steps/lr keys and the metric names
        (a runner spanning nodes adds the role and the address; nodes 2 without one: the gate starts the rollout
        server itself on loopback)."""
        return {"gate": gate, **self.recipe, "steps": self.steps, "logger_key": "trainer.logger",
                "logger": ["console", "file"], "cache_dir": CACHE_DIR, "work_dir": WORK_DIR, "manifest": MANIFEST,
                "weights": self.weights, "checkpoint": self.checkpoint.wire() if self.checkpoint else None,
                "performance": dict(self.performance.spec) if self.performance else None,
                "layout": {"nodes": self.nodes}}


JIT_ISOLATION = "image sha256, components' commits, GPU architecture, rank"
Arm = Literal["aligned", "control"]
ARMS: tuple[Arm, Arm] = ("aligned", "control")  # a performance pair's runs, in their order


@dataclass(frozen=True)
class Layout:
    """How a gate's ranks lie: `hosts` None on one machine (nodes 2 there: the gate starts the rollout server itself on
    loopback), else rank 0 trains and rank 1 serves the rollout at `rollout_host`."""

    nodes: int
    hosts: tuple[str, ...] | None = None
    rollout_host: str | None = None

    def wire(self) -> dict[str, JsonValue]:
        if self.hosts is None:
            return {"nodes": self.nodes}
        return {"nodes": self.nodes, "hosts": list(self.hosts), "rollout_host": self.rollout_host}


@dataclass(frozen=True)
class Placement:
    """Where a runner spanning nodes runs the gate: the container's cache directory, the node layout, and the
    node-local JIT cache's directory and key (none: a fresh cache per gate)."""

    cache_dir: str
    layout: Layout
    jit_dir: str | None = None
    jit_key: str = ""

    def wire(self) -> dict[str, JsonValue]:
        jit: dict[str, JsonValue] = {} if self.jit_dir is None else {"jit_cache": {
            "dir": self.jit_dir, "key": self.jit_key, "node_local": True, "isolation": JIT_ISOLATION}}
        return {"cache_dir": self.cache_dir, "layout": self.layout.wire(), **jit}


@dataclass(frozen=True)
class GateCall:
    """One gate run: the acceptance's settings, the gate, and for a performance run its arm (its steps then are the
    performance gate's). `census` False only in benchmarks that time the gate without it."""

    gate: str
    settings: GateSettings
    arm: Arm | None = None
    census: bool = True

    def wire(self, place: Placement | None = None) -> dict[str, JsonValue]:
        perf = self.settings.performance
        arm: dict[str, JsonValue] = {} if self.arm is None else {
            "steps": perf.steps if perf else self.settings.steps, "arm": self.arm}
        return {**self.settings.wire(self.gate), **arm, **({} if self.census else {"census": False}),
                **(place.wire() if place else {})}


@dataclass(frozen=True)
class ReplayCall:
    """One replay of a stored bundle (the in-image `gate replay`) within `timeout_s`."""

    bundle: MappingProxyType[str, Any]
    timeout_s: int
    gate: str = "replay"

    def wire(self, place: Placement | None = None) -> dict[str, JsonValue]:
        return {"bundle": dict(self.bundle), "timeout_s": self.timeout_s, "work_dir": WORK_DIR,
                **(place.wire() if place else {})}


Call = GateCall | ReplayCall  # what a GateRunner runs
