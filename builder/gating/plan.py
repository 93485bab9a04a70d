"""The acceptance plan: made once from the pins, the command's flags and the settings, checked as a whole, frozen.

It says which gates run and why, each gate's time limit and how many containers it starts, where the gates run
(the build's engine, another engine pulled by digest, or a Slurm cluster with its site options and node count),
and the image. builder/runners/factory.py turns it into a GateRunner; the use cases take a `Plan`, never a dozen
values, and nothing above the runners asks which kind of place it is.

Time limits have one meaning each: a gate's limit (`--timeout`, else `acceptance.timeout_s`) bounds its step
and the builder's cancel of it; a Slurm allocation lasts the sum of what will run, plus the node check, plus
MARGIN_S, and a plan whose allocation exceeds the site's cap (`acceptance.slurm.allocation_limit_s`) is refused
before anything is submitted.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from builder.core.constants import GATES
from builder.core.errors import BadInput
from builder.core.imageref import by_digest
from builder.core.options import Settings
from builder.engine import platforms
from builder.pins.model import TIMEOUT_S, Pins

CHECK_S = 120    # the node check (hash the .sqsh, read the image's environment); one minute of Slurm's granularity
MARGIN_S = 120   # allocation time beyond the gates and the check: step start-up and accounting


@dataclass(frozen=True)
class GatePlan:
    name: str
    run: bool
    why: str             # why it runs ("required by the pins", "asked for with --gate") or why not
    runs: int            # containers or steps it starts (performance: 2 x repeats)
    timeout_s: int       # per container or step: bounds the step's --time and the builder's cancel


@dataclass(frozen=True)
class DockerPlace:
    """A Docker engine: the build's (DOCKER_HOST) or `engine_url`, pulled by digest when staged."""

    engine_url: str | None = None


@dataclass(frozen=True)
class SlurmPlace:
    """A Slurm cluster (SLURM_CONF): the site's options from acceptance.slurm, read once."""

    shared_dir: Path
    partition: str | None
    account: str | None
    qos: str | None
    srun_args: tuple[str, ...]
    runtime: str
    gpus: int
    nodes: int
    node_local_dir: str | None
    allocation_s: int
    allocation_limit_s: int | None
    check_s: int = CHECK_S
    margin_s: int = MARGIN_S

    def allocation_args(self) -> list[str]:
        args = [f"--partition={self.partition}"] if self.partition else []
        args += [f"--account={self.account}"] if self.account else []
        args += [f"--qos={self.qos}"] if self.qos else []
        return args + ([f"--gpus-per-node={self.gpus}"] if self.gpus else [])


Place = DockerPlace | SlurmPlace


@dataclass(frozen=True)
class AcceptancePlan:
    gates: tuple[GatePlan, ...]
    place: Place
    image: str | None = None      # None: the run builds it; an image ID, or REPOSITORY@sha256:... to pull
    stage: bool = False           # push the build to staging by digest and accept the pulled digest

    def gate(self, name: str) -> GatePlan:
        return next(g for g in self.gates if g.name == name)

    @property
    def on_cluster(self) -> bool:
        """The gates run as Slurm steps (a use case that plans again, as bisect, keeps the place by this)."""
        return isinstance(self.place, SlurmPlace)


@dataclass(frozen=True)
class Flags:
    """What a command line asked for (all optional; the CLI fills what it has)."""

    image: str | None = None
    gates: Sequence[str] = ()
    timeout_s: int | None = None
    engine_url: str | None = None
    slurm: bool = False
    stage: bool = False
    offline: bool = False
    allow_moved_pr: bool = False
    nocache: bool = False
    out: Path | None = None
    key: Path | None = None
    publish: bool = False
    export: bool = False
    follow_prs: bool = False
    today: str | None = None


@dataclass(frozen=True)
class Plan:
    """One command's whole plan: the acceptance plan, and the flags it was made from for what the run does around
    it (resolve offline, build, out, publish with the key: the command's, else the settings' signing key)."""

    acceptance: AcceptancePlan
    flags: Flags = Flags()


def gate_plans(pins: Pins, asked: Sequence[str], timeout_s: int | None) -> tuple[GatePlan, ...]:
    """Every gate, in order: the asked ones (`--gate`), else the pins' required ones; BadInput for an unknown gate
    or a limit out of range."""
    unknown = [g for g in asked if g not in GATES]
    if unknown:
        raise BadInput(f"--gate: expected one of {', '.join(GATES)}, got {unknown[0]!r}")
    if timeout_s is not None and not TIMEOUT_S[0] <= timeout_s <= TIMEOUT_S[1]:
        raise BadInput(f"--timeout: expected seconds in {TIMEOUT_S[0]}..{TIMEOUT_S[1]}, got {timeout_s!r}")
    limit = timeout_s or pins.acceptance.timeout_s
    perf = pins.acceptance.performance
    out = []
    for name in GATES:
        if asked:
            run, why = name in asked, "asked for with --gate" if name in asked else "not selected"
        else:
            run = name in pins.acceptance.required_gates
            why = "required by the pins" if run else "not in acceptance.required_gates (ask with --gate)"
        if name == "performance" and run and perf is None:
            run, why = False, "no acceptance.performance in the pins"
        runs = 2 * perf.repeats if name == "performance" and perf else 1
        out.append(GatePlan(name=name, run=run, why=why, runs=runs if run else 0, timeout_s=limit))
    return tuple(out)


def on_this_engine(gates: tuple[GatePlan, ...], platform: str) -> tuple[GatePlan, ...]:
    """On the local engine an image of another architecture runs emulated (binfmt): only provenance runs there. The
    recipe gates read not_run, "needs a native <arch> node", never pass: a pins that requires one is not accepted."""
    if not platforms.emulated(platform):
        return gates
    why = platforms.needs_native(platform)
    return tuple(g if g.name == "provenance" else replace(g, run=False, why=why, runs=0) for g in gates)


def slurm_place(pins: Pins, gates: tuple[GatePlan, ...], settings: Settings) -> SlurmPlace:
    """The cluster place: the allocation is what will run plus the check and the margin, within the site's cap."""
    site = pins.acceptance.slurm
    steps = sum(g.runs * g.timeout_s for g in gates if g.run)
    allocation = steps + CHECK_S + MARGIN_S
    cap = site.allocation_limit_s
    if cap is not None and allocation > cap:
        raise BadInput(f"acceptance.slurm.allocation_limit_s: {cap} s cannot hold the plan's allocation of "
                       f"{allocation} s (gates {steps} s + node check {CHECK_S} s + margin {MARGIN_S} s)")
    shared = Path(site.shared_dir) if site.shared_dir else settings.slurm_shared_dir or settings.cache("cluster-images")
    return SlurmPlace(shared_dir=shared, partition=site.partition, account=site.account, qos=site.qos,
                      srun_args=tuple(site.srun_args), runtime=site.runtime, gpus=pins.acceptance.gpus,
                      nodes=pins.acceptance.nodes, node_local_dir=site.node_local_dir, allocation_s=allocation,
                      allocation_limit_s=cap)


def make(pins: Pins, flags: Flags, settings: Settings) -> Plan:
    """The plan for one command, checked as a whole before anything is built or submitted."""
    if flags.export and not flags.publish:
        raise BadInput("--sqsh: expected --publish too (the .sqsh is recorded beside the registry digest)")
    engine_url = flags.engine_url or (str(pins.acceptance.engine) if pins.acceptance.engine else None)
    if flags.slurm and engine_url:
        raise BadInput("--slurm: expected no --engine / acceptance.engine (the gates run on the cluster)")
    if flags.image is not None and engine_url and by_digest(flags.image) is None:
        raise BadInput("--engine: expected --image REPOSITORY@sha256:<digest> (another engine pulls by digest)")
    gates = gate_plans(pins, list(flags.gates), flags.timeout_s)
    if not flags.slurm and not engine_url:
        gates = on_this_engine(gates, pins.base.platform)
    place: Place = slurm_place(pins, gates, settings) if flags.slurm else DockerPlace(engine_url)
    acceptance = AcceptancePlan(gates=gates, place=place, image=flags.image,
                                stage=flags.image is None and (flags.stage or bool(engine_url)))
    return Plan(acceptance=acceptance, flags=replace(flags, key=flags.key or settings.signing_key))

