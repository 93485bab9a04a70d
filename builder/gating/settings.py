"""The acceptance settings the gates run with: one frozen value read once from the pins (`GateSettings.of`) and
passed down the gate loop. The host reads its typed fields (steps, limits, nodes, the performance rule, the weight
mode, mounts); `wire(gate)` is the JSON the in-image suite reads (acceptance/__main__.py), whose keys never change:
images built before read them too."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

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
