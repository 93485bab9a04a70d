"""A gate's evidence as the in-image suite writes it (acceptance/__main__.py), typed: `Evidence` and the nested
records it holds. The nested ones stay JSON objects (TypedDicts: plain dicts at run time, typed for the checker),
each keeping the keys it does not name, so evidence from an older or newer suite loads as it came. A value of
another shape never refuses a gate's output: the typed key or field reads None instead (`Lax`)."""
from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    with_config,
)
from typing_extensions import TypedDict


def _shape_or_none(value: object, handler: ValidatorFunctionWrapHandler) -> object:
    """A gate's own output is never refused for a value of another shape: the typed field reads None instead."""
    try:
        return handler(value)
    except ValidationError:
        return None


Lax = WrapValidator(_shape_or_none)
Real = Annotated[StrictFloat | None, Lax]  # a number of a gate's output (a bool or a string is not one)
Whole = Annotated[StrictInt | None, Lax]
Text = Annotated[StrictStr | None, Lax]
Flag = Annotated[StrictBool | None, Lax]
Texts = Annotated[list[str] | None, Lax]
Metric = Annotated[StrictFloat | StrictStr | None, Lax]  # a step's value: a number, or "nan"/"inf" as the suite writes one
JsonObject = Annotated[dict[str, JsonValue] | None, Lax]  # a gate's record of named JSON values
JsonRows = Annotated[list[dict[str, JsonValue]] | None, Lax]
RowsOrCount = Annotated[list[dict[str, JsonValue]] | StrictInt | None, Lax]  # the rows, or (older suites) a count
OPEN = ConfigDict(extra="allow")  # a nested record keeps the keys it does not name


@with_config(OPEN)
class StepRow(TypedDict, total=False):
    """One step of a recipe gate: the metrics its decision used."""
    diff_max: Metric
    diff_mean: Metric
    k3_kl: Metric
    reward: Metric
    loss: Metric
    throughput: Metric
    weights_before: Text
    weights_after: Text


@with_config(OPEN)
class ProcessRow(TypedDict, total=False):
    """One Python process a recipe ran, as its record says (acceptance/processes.py)."""
    pid: Whole
    ppid: Whole
    name: Text
    node: Text
    image: Text
    record: Text
    forked: Flag
    argv: Texts
    executable: Text
    mnt_ns: Text
    modules: Annotated[dict[str, str | None] | None, Lax]
    libs: JsonValue
    libraries: Annotated[dict[str, str | None] | None, Lax]
    library_sha256: JsonObject
    library_deps: JsonObject       # per owned library: its DT_NEEDED names and CUDA targets (acceptance/elf.py)
    complete: Flag
    status: Text
    failures: Texts
    run: Text                      # the report's list: the performance run it belongs to ("aligned 1")


Processes = Annotated[list[ProcessRow] | StrictStr | None, Lax]  # text: "off (...)" when not recorded


@with_config(OPEN)
class NodeCensus(TypedDict, total=False):
    """One node's part of the census: the processes seen, those that recorded, those that did not, helpers."""
    seen: RowsOrCount
    recorded: RowsOrCount
    unrecorded: JsonRows
    helpers: RowsOrCount


@with_config(OPEN)
class Census(TypedDict, total=False):
    """What the gate's census saw (acceptance/census.py), per node; across nodes, each node's image."""
    node: Text
    image: Text
    interval_s: Real
    polls: Whole
    cpu_s: Real                        # the census in all: its thread and, under Docker, its container
    cpu_parts: JsonObject              # {thread, fanotify}: each part's CPU seconds
    fanotify: JsonObject               # the census container's reader: state, why, floor, marks (acceptance/exec_events.py)
    seconds: Real
    subreaper: Flag
    rule: Text
    nodes: Annotated[dict[str, NodeCensus] | None, Lax]
    images: Annotated[dict[str, str | None] | None, Lax]


Censuses = Annotated[Census | StrictStr | None, Lax]  # text: "off (...)" when the census did not run


@with_config(OPEN)
class RunLayout(TypedDict, total=False):
    """How a recipe across nodes met: the address its ranks used, the nodes, the mode."""
    address: Text
    nodes: Whole
    mode: Text


@with_config(OPEN)
class RunFacts(TypedDict, total=False):
    """What the recipe run itself reported (acceptance/recipe.py): its layout, the node's own environment."""
    layout: Annotated[RunLayout | None, Lax]
    node_env: Annotated[dict[str, str] | None, Lax]


@with_config(OPEN)
class GateOutput(TypedDict, total=False):
    """Another rank's evidence, or a failed performance run's: the part of a gate's evidence the host reads."""
    run: Annotated[RunFacts | None, Lax]
    processes: Processes
    census: Censuses
    process_failures: Texts
    node: Text
    seconds: Real


@with_config(OPEN)
class Rank(TypedDict, total=False):
    """Another rank of a recipe across nodes: its node, role, status, reason and evidence."""
    rank: Whole
    node: Text
    role: Text
    status: Text
    reason: Text
    evidence: Annotated[GateOutput | None, Lax]


@with_config(OPEN)
class PerfRun(TypedDict, total=False):
    """One run of the performance gate: its arm, throughput, per-step values, status and processes."""
    run: Whole
    arm: Text
    status: Text
    throughput: Metric
    steps: Annotated[list[float | str | None] | None, Lax]
    seconds: Real
    processes: Processes


@with_config(OPEN)
class FirstDiff(TypedDict, total=False):
    """The first differing position of a replay: a tensor's index (weights), or a row and token (logprobs)."""
    tensor: Text
    index: JsonValue
    before: JsonValue
    after: JsonValue
    position: Annotated[list[int] | None, Lax]
    trainer: JsonValue
    rollout: JsonValue


@with_config(OPEN)
class ReplaySummary(TypedDict, total=False):
    """The replay bundle's summary in the report (acceptance/replay.py; the whole bundle is its own file), and
    what a replay of it saw (its error, image and seconds besides)."""
    schema: Whole
    gate: Text
    differs: Flag
    note: Text
    kind: Text
    step: Whole
    count: Whole
    first: Annotated[list[FirstDiff] | None, Lax]
    file: Text
    weights: JsonObject
    batch: JsonObject
    error: Text
    image: Text
    seconds: Real


@with_config(OPEN)
class JitEntry(TypedDict, total=False):
    """One compile-cache entry (acceptance/jitcache.py) and where it came from."""
    file: Text
    kernel: Text
    compiler: Text
    origin: Text


@with_config(OPEN)
class JitRecord(TypedDict, total=False):
    """What the JIT compilers added or changed during a recipe run."""
    dirs: Texts
    entries: Annotated[list[JitEntry] | None, Lax]
    count: Whole
    kernels: Texts
    changed: Whole


@with_config(OPEN)
class Stamp(TypedDict, total=False):
    commit: Text


@with_config(OPEN)
class ModuleSeen(TypedDict, total=False):
    file: Text


@with_config(OPEN)
class FilesSeen(TypedDict, total=False):
    manifest: Whole


@with_config(OPEN)
class ComponentSeen(TypedDict, total=False):
    """The provenance gate's view of one component: its version, modules, stamp and files."""
    version: Text
    modules: Annotated[dict[str, ModuleSeen] | None, Lax]
    stamp: Annotated[Stamp | None, Lax]
    files: Annotated[FilesSeen | None, Lax]


@with_config(OPEN)
class LoadedLib(TypedDict, total=False):
    """A native library the provenance check saw loaded, and whose it is."""
    component: Text
    sha256: Text


@with_config(OPEN)
class BuildIsolation(TypedDict, total=False):
    """What the build container saw (the BUILD-ENV record, builder/image/build.py isolation)."""
    checked: Flag
    reason: Text
    net: Texts
    mountinfo: Texts
    problems: Texts


@with_config(OPEN)
class NodeCheck(TypedDict, total=False):
    """A node's hashing step: seconds, bytes, hasher, its Slurm step."""
    seconds: Real
    bytes: Whole
    hasher: Text
    step: Text


@with_config(OPEN)
class GateFacts(TypedDict, total=False):
    """Where and how one gate's container or step ran (a runner's facts); the performance gate: its runs'."""
    runs: Annotated[list[GateFacts] | None, Lax]
    arm: Text
    run: Whole
    seconds: Real
    timed_out: Flag
    job_id: Text
    step: Text
    node: Text
    state: Text
    exit_code: JsonValue
    mounts: JsonRows
    image: Text
    network: Text
    networks: Texts
    tmpfs: Annotated[dict[str, str] | None, Lax]


@with_config(OPEN)
class Throughput(TypedDict, total=False):
    """Rollout throughput of the two arms and their ratio (builder/gating/gates.py throughput)."""
    metric: Text
    aligned: Real
    control: Real
    ratio: Real
    source: Text
    min_ratio: Real
    confidence: Real
    pairs: Whole
    stopped: Text
    max_spread: Real
    runs: Annotated[list[PerfRun] | None, Lax]


@with_config(OPEN)
class RunEnvironment(TypedDict, total=False):
    """The acceptance run's environment: the runner, the engine, what the provenance gate read."""
    runner: Text
    engine: Text
    interpreter: JsonObject
    numeric_env: JsonObject
    gpu: Annotated[StrictStr | dict[str, JsonValue] | None, Lax]
    manifest: JsonObject


class ArmStats(BaseModel):
    """The performance gate's record of one arm: its runs' throughputs, their median and spread."""
    model_config = ConfigDict(extra="allow", frozen=True)

    runs: Annotated[list[float | None] | None, Lax] = None
    median: Real = None
    spread: Real = None


class Evidence(BaseModel):
    """A gate's evidence as the in-image suite wrote it (acceptance/__main__.py). The fields other packages read
    are named here (their readers check each value's shape: a gate's output is never refused for it); the rest of
    what a gate saw stays in the record as it came (extra keys, kept for the report)."""
    model_config = ConfigDict(extra="allow", frozen=True)

    steps: Annotated[dict[str, StepRow] | None, Lax] = None  # per step: the metrics the decision used
    diff_max: Real = None
    k3_kl: Real = None
    ratio: Real = None             # performance: the geometric mean of the pairs' ratios
    min_ratio: Real = None
    pairs: Whole = None            # performance: how many pairs ran, and why the gate stopped
    stopped: Text = None
    confidence: Real = None
    max_spread: Real = None
    metric: Text = None
    aligned: Annotated[ArmStats | None, Lax] = None  # performance: one arm's runs, median, spread
    control: Annotated[ArmStats | None, Lax] = None
    runs: Annotated[list[PerfRun] | None, Lax] = None  # performance: every run
    throughput: Real = None
    throughput_steps: Annotated[list[float | str | None] | None, Lax] = None
    weights: Annotated[list[str] | dict[str, JsonValue] | None, Lax] = None  # checksums, or the checkpoints'
    components: Annotated[dict[str, ComponentSeen] | None, Lax] = None  # provenance: per component
    failures: Texts = None
    exit_code: Whole = None
    replay: Annotated[ReplaySummary | None, Lax] = None  # the replay bundle's summary
    jit: Annotated[JitRecord | None, Lax] = None  # what the JIT compilers added or changed during the run
    processes: Processes = None
    process_failures: Texts = None
    census: Censuses = None        # per node: the processes seen and recorded
    run: Annotated[RunFacts | None, Lax] = None  # what the recipe run reported
    ranks: Annotated[list[Rank] | None, Lax] = None  # a recipe across nodes: every other rank's
    failed_run: Annotated[GateOutput | None, Lax] = None  # performance: the run that failed the gate
    rank_logs: dict[str, str] | None = None  # Slurm: per rank ("rank1 n2") its log; in report.json the file's path
    node: Text = None
    seconds: Real = None
    timeout_s: Whole = None
    # the provenance gate's (acceptance/provenance.py)
    interpreter: JsonObject = None
    manifest: JsonObject = None
    environment: JsonObject = None
    gpu: Annotated[StrictStr | dict[str, JsonValue] | None, Lax] = None  # "none", or the GPU facts
    native_libs_loaded: Annotated[dict[str, LoadedLib] | None, Lax] = None
    caches_at_start: JsonObject = None
    jit_cache: JsonObject = None

    def get(self, key: str, default: object = None) -> object:
        """A field, or a key the record does not name (an older or newer suite's), by name; builder reads fields."""
        value = getattr(self, key, None) if key in type(self).model_fields else (self.model_extra or {}).get(key)
        return default if value is None else value

    def as_dict(self) -> dict[str, JsonValue]:
        return self.model_dump(mode="json", exclude_none=True)
