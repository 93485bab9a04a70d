"""Typed records that flow one way through the stages: sources -> build -> acceptance -> report -> publish.

DESIGN.md's record tables are generated from these models (`make docs`: tests/gendocs.py) and a test
checks they match.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, JsonValue, Tag

from builder.core.evidence import ArmStats as ArmStats  # re-exported: the records hold them
from builder.core.evidence import (
    BuildIsolation,
    GateFacts,
    NodeCheck,
    ProcessRow,
    RunEnvironment,
    RunLayout,
    Throughput,
)
from builder.core.evidence import Evidence as Evidence
from builder.core.imageref import ImageRef, Repository

GateStatus = Literal["pass", "fail", "inconclusive", "not_run"]
MaybeRef = Annotated[ImageRef | None, BeforeValidator(lambda v: v or None)]  # "" in older reports


class Record(BaseModel):
    """A record is made once and never changed: a later stage makes a new one (`model_copy(update=...)`)."""
    model_config = ConfigDict(extra="forbid", frozen=True)


class Submodule(Record):
    path: str
    url: str
    commit: str
    tree: str = "unknown"


class ResolvedComponent(Record):
    name: str
    url: str
    target: str
    pr: int
    commit: str
    tree: str
    commit_time: int
    pr_head: str
    pr_moved: bool
    merge_base: str
    ahead: int
    behind: int
    target_head: str
    submodules: list[Submodule] = Field(default_factory=list)
    export_sha256: str
    files: int
    version: str = ""  # from VCS metadata (setuptools-scm, hatch-vcs) at the commit; "" when static


class ResolvedSources(Record):
    pins_path: str
    pins_sha256: str
    resolved_at: str
    components: dict[str, ResolvedComponent]


class RenderedBuild(Record):
    dockerfile: str
    dockerfile_sha256: str
    context_path: str
    context_sha256: str
    labels: dict[str, str]
    tag: str
    layer_epochs: list[int] = []  # source date of each layer the runtime stage adds (normalisation clamps to it)
    cache_key: str = ""  # which run this is (render.cache_key): its builds run one at a time
    base_digest: str = ""  # the base's platform manifest the Dockerfile names (engine/platforms.py)
    base_index_digest: str | None = None  # the index the pins named, when they named one (never in the image)


class BuiltImage(Record):
    image_id: str
    tags: list[str]
    size: int
    created: str
    engine_version: str
    builder_version: str
    context_sha256: str
    dockerfile_sha256: str
    stage_times: dict[str, float]  # seconds measured in this run
    log_path: str
    cached: bool
    isolation: BuildIsolation = Field(default_factory=BuildIsolation)  # what the build container saw (build.isolation)
    # reproducible image (builder/engine/normalize.py): image_id is the normalised config digest
    raw_image_id: str = ""          # what the engine's build produced
    manifest_digest: str = ""       # registry manifest digest of the normalised image
    source_date: str = ""           # every added mtime clamped to it; config created
    base_digest: str = ""           # the base's platform manifest (its index's digest below, when pinned by one)
    base_index_digest: str | None = None
    staged: MaybeRef = None         # <staging repository>@<manifest digest> once pushed
    cached_stages: list[str] = []   # stages this run reused (engine cache hits, a stored normalisation)


def number(value: Any) -> float | None:
    """A value of a record's free-form part (evidence, timings) as a number, or None: a bool is not one."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _evidence(value: object) -> object:
    return Evidence() if value is None else value


class GateResult(Record):
    name: str
    status: GateStatus
    reason: str
    evidence: Annotated[Evidence, BeforeValidator(_evidence)] = Field(default_factory=Evidence)
    log: str = ""


class EngineFacts(Record):
    """Who a Docker engine is (builder/engine/client.py facts), and the URL it was reached at."""
    id: str | None = None
    host: str | None = None
    version: str | None = None
    os: str | None = None
    arch: str | None = None
    gpus: dict[str, JsonValue] = Field(default_factory=dict)
    data_root: str | None = None
    url: str | None = None


class Pulled(Record):
    """What acceptance pulled by digest: the reference, its manifest digest, the image ID the engine made."""
    ref: ImageRef
    digest: str
    image_id: str
    engine: EngineFacts | None = None


class SqshFacts(Record):
    """The candidate .sqsh the cluster gates mounted (its export record)."""
    path: str
    sha256: str
    size: int = 0
    image_id: str = ""
    staged: str | None = None
    compression: str = ""
    reused_layers: int = 0


class NodeFacts(Record):
    """One node of the allocation: what it saw of the image and where it read it from."""
    name: str
    sqsh_sha256: str | None = None     # sha256 of the .sqsh this node mounts, hashed on the node
    sqsh_path: str | None = None       # the file the node mounts (node-local copy or the shared one)
    staged: str | None = None          # node-local staging: "hit", "filled", "refreshed", or None (shared)
    cache_path: str | None = None      # the node's JIT cache directory
    runtime_version: str | None = None
    gpus: str | None = None
    environment: str | None = None     # the image's /etc/environment as read on the node
    address: str | None = None         # the node's address (Slurm's NodeAddr): the recipe's ranks meet there
    check: NodeCheck = Field(default_factory=NodeCheck)  # the hashing step: seconds, bytes, hasher, Slurm step


class Limits(Record):
    """The time limits really applied: each gate's (its step and the builder's cancel), and the allocation."""
    gate_timeout_s: dict[str, int] = Field(default_factory=dict)
    allocation_s: int | None = None    # Slurm: the allocation's --time, in seconds (derived from the plan)
    allocation_limit_s: int | None = None  # the site's cap it was checked against
    check_s: int | None = None         # Slurm: the node check's limit
    margin_s: int | None = None


class RunnerFacts(Record):
    """Where the gates ran, as the runner describes it, and per gate the facts of each container or step: what every
    runner has. A report holds one of its two kinds: `DockerFacts` or `SlurmFacts`."""
    runner: str = "unknown"            # a display name of where the gates ran
    engine: str | None = None
    network: str | None = None
    isolation: dict[str, str] = Field(default_factory=dict)
    image_id: str = ""
    run_id: str = ""
    mounts: list[dict[str, JsonValue]] = Field(default_factory=list)
    gpus: int = 0
    layout: RunLayout = Field(default_factory=RunLayout)  # nodes and roles of a multi-node recipe
    limits: Limits = Field(default_factory=Limits)
    weights: str | None = None
    checkpoint: dict[str, JsonValue] | None = None
    gates: dict[str, GateFacts] = Field(default_factory=dict)  # per gate: its runs' container/step facts

    def steps(self) -> list[tuple[str, GateFacts]]:
        """(gate label, facts) of every container or step, performance runs one by one."""
        out = []
        for gate, facts in self.gates.items():
            for run in facts.get("runs") or [facts]:
                label = gate + (f" {run.get('arm')} {run.get('run')}" if run.get("arm") else "")
                out.append((label, run))
        return out


class DockerFacts(RunnerFacts):
    """A fresh local container per gate: the Docker engine (this one or another), or runc on a tree (the smoke)."""
    home: str | None = None
    label: str | None = None
    tmpfs: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)


class SlurmFacts(RunnerFacts):
    """A Slurm step per gate from the candidate's .sqsh, on every node of one allocation."""
    cluster: str | None = None
    job_id: str | None = None
    partition: str | None = None
    runtime: str | None = None
    runtime_version: str | None = None
    srun_args: list[str] = Field(default_factory=list)
    nodes: list[NodeFacts] = Field(default_factory=list)
    sqsh: SqshFacts | None = None      # the .sqsh the gates mounted


def _facts_kind(value: Any) -> str:
    """Which kind a stored record is: a cluster's names its job, its .sqsh or its nodes."""
    if isinstance(value, dict):
        return "cluster" if any(value.get(k) for k in ("job_id", "sqsh", "nodes", "cluster")) else "container"
    return "cluster" if isinstance(value, SlurmFacts) else "container"


def _facts_fields(value: Any) -> Any:
    """Reports written before the split name every field of both kinds, the other kind's empty: those go."""
    if not isinstance(value, dict):
        return value
    kind = SlurmFacts if _facts_kind(value) == "cluster" else DockerFacts
    return {k: v for k, v in value.items() if k in kind.model_fields or v not in (None, "", [], {})}


AnyRunnerFacts = Annotated[Annotated[DockerFacts, Tag("container")] | Annotated[SlurmFacts, Tag("cluster")],
                           Discriminator(_facts_kind), BeforeValidator(_facts_fields)]


class AcceptanceResult(Record):
    image_id: str
    where: AnyRunnerFacts = Field(default_factory=DockerFacts,  # "container" in reports before it was renamed
                                  validation_alias=AliasChoices("where", "container"))
    gates: list[GateResult]
    environment: RunEnvironment = Field(default_factory=RunEnvironment)
    throughput: Throughput = Field(default_factory=Throughput)
    pulled: Annotated[Pulled | None, BeforeValidator(lambda v: v or None)] = None  # when pulled by digest


class PublishReceipt(Record):
    repository: Repository
    tags: list[str]
    digest: str
    config_digest: str
    verified: bool
    pushed_at: str
    platform: str = "unknown"          # os/architecture of the config blob the registry serves
    attestations: list[str] = Field(default_factory=list)  # digests of the signed artifacts referring to it
    index: str | None = None  # repository@digest of the multi-arch index it was published in (builder/release/multiarch.py)


class SqshExport(Record):
    """The enroot .sqsh of the accepted image (builder/release/sqsh.py)."""
    path: str                          # the file, kept by its sha256 (`sha256-<hex>.sqsh`; an older export's name)
    sha256: str
    size: int
    compression: str                   # mksquashfs options (options.SQUASH_OPTIONS by default)
    mksquashfs: str                    # version line
    mksquashfs_args: list[str]
    mtimes: str = ""                   # "layers": each file's time as its layer has it ("": an older export's)
    image_id: str
    tag: str                           # the SHA tag
    registry_digest: str               # the published manifest digest, or "not published"
    entries: int                       # paths compared with the layers' final tree
    files: int                         # regular files among them
    xattrs: bool
    enroot_files: dict[str, str]       # /etc files enroot writes from the image config: sha256
    equivalence: str
    smoke: dict[str, Any]              # provenance gate on the .sqsh contents
    seconds: dict[str, float]
    created: str
    pointer: str = ""                  # the pointer under the SHA tag naming it when placed (sqsh_layout.py)


class CompatPin(Record):
    """A compatibility pin as the report records it (from the pins' `compat`)."""
    package: str
    version: str
    reason: str


class Layer(BaseModel):
    """One run-manifest layer: the fields other packages read are typed, the rest kept as written."""
    model_config = ConfigDict(extra="allow", frozen=True)


class ContainerLayer(Layer):
    image_id: str = "unknown"
    registry_digest: str = "unknown"
    platform: str = "unknown"
    base_image: str = "unknown"
    base_digest: str = "unknown"        # the platform manifest the build used
    base_index_digest: str | None = None  # the multi-arch index the pins named, if they named one


class RunLayer(Layer):
    pins_file: str = "unknown"
    pins_sha256: str = "unknown"
    lock_file: str = "unknown"
    lock_sha256: str = "unknown"
    components_shared: list[str] | str | None = None


class RunManifest(Record):
    """The six layers a run is reproduced from (builder/report/manifest.py), and the native build inputs."""
    source: Any = None
    installed_packages: Any = None
    native_libraries: Any = None
    jit_caches: Any = None
    container: ContainerLayer = Field(default_factory=ContainerLayer)
    run: RunLayer = Field(default_factory=RunLayer)
    native_build: dict[str, Any] = Field(default_factory=dict)

    def layers(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Report(Record):
    verdict: Literal["ACCEPTED", "NOT ACCEPTED"]
    name: str
    sources: ResolvedSources
    build: BuiltImage | None = None
    acceptance: AcceptanceResult | None = None
    run_manifest: RunManifest = Field(default_factory=RunManifest)
    platform: str = "unknown"
    base_image: str = "unknown"
    publish: PublishReceipt | None = None
    sqsh: SqshExport | None = None
    # added by report.py: what the report is about and how the verdict was reached
    image_id: str = "unknown"
    repository: Repository | Literal["unknown"] = "unknown"  # parsed once as the report loads
    tags: list[str] = Field(default_factory=list)      # sha tag first, then pins.image.tags
    required_gates: list[str] = Field(default_factory=list)
    gates: list[GateResult] = Field(default_factory=list)   # every gate; missing ones read not_run
    reasons: list[str] = Field(default_factory=list)  # why NOT ACCEPTED (empty when ACCEPTED)
    compat: list[CompatPin] = Field(default_factory=list)
    lock_sha256: str = "unknown"  # sha256 of the pins' build.lock (written by `builder lock`)
    created: str = ""
    rebuild: dict[str, Any] | None = None  # `builder rebuild --check`: digests compared, per-layer file diff
    processes: dict[str, list[ProcessRow]] = Field(default_factory=dict)  # per recipe gate: the processes it ran
    lock_lines: dict[str, str] = Field(default_factory=dict)  # distribution of a loaded native library -> lock line
    runtime_libraries: list[dict[str, Any]] = Field(default_factory=list)  # the pins' named ones: six layers each


RECORDS: tuple[type[BaseModel], ...] = (
    Submodule, ResolvedComponent, ResolvedSources, RenderedBuild, BuiltImage, ArmStats, Evidence, GateResult,
    EngineFacts, Pulled, SqshFacts, NodeFacts, Limits, RunnerFacts, DockerFacts, SlurmFacts, CompatPin,
    AcceptanceResult, PublishReceipt, SqshExport,
    ContainerLayer, RunLayer, RunManifest, Report)


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if getattr(annotation, "__origin__", None) is None else None
    text = (text or str(annotation)).replace("typing.", "")
    text = re.sub(r"builder\.core\.\w+\.", "", text)
    text = re.sub(r"Annotated\[(\w+), [^\]]*\]", r"\1", text)  # a tagged union's members by name
    union = re.fullmatch(r"Union\[(.*)\]", text)
    if union is None:
        return text
    parts, depth, start = [], 0, 0  # the members, split at the commas outside brackets
    for i, ch in enumerate(union.group(1)):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(union.group(1)[start:i].strip())
            start = i + 1
    return " | ".join([*parts, union.group(1)[start:].strip()]).replace("NoneType", "None")


def design_tables() -> str:
    """The Markdown tables DESIGN.md carries for every record (field, type, default)."""
    out = []
    for model in RECORDS:
        out += [f"#### `{model.__name__}`", "", "| field | type | default |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            default = "required" if field.is_required() else (
                "[]" if field.default_factory is list else "{}" if field.default_factory is dict
                else f"{field.default_factory.__name__}()" if isinstance(field.default_factory, type)
                else repr(field.default))
            out.append(f"| `{name}` | `{_type_name(field.annotation)}` | {default} |")
        out.append("")
    return "\n".join(out)

