"""Typed records that flow one way through the stages: sources -> build -> acceptance -> report -> publish.

DESIGN.md's record tables are generated from these models (`make docs`: tests/gendocs.py) and a test
checks they match.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from builder.core.imageref import ImageRef

GateStatus = Literal["pass", "fail", "inconclusive", "not_run"]
MaybeRef = Annotated[ImageRef | None, BeforeValidator(lambda v: v or None)]  # "" in older reports


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    isolation: dict[str, Any] = Field(default_factory=dict)  # what the build container saw (build.isolation)
    # reproducible image (builder/engine/normalize.py): image_id is the normalised config digest
    raw_image_id: str = ""          # what the engine's build produced
    manifest_digest: str = ""       # registry manifest digest of the normalised image
    source_date: str = ""           # every added mtime clamped to it; config created
    staged: MaybeRef = None         # <staging repository>@<manifest digest> once pushed
    cached_stages: list[str] = []   # stages this run reused (engine cache hits, a stored normalisation)


class GateResult(Record):
    name: str
    status: GateStatus
    reason: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    log: str = ""


class EngineFacts(Record):
    """Who a Docker engine is (builder/engine/client.py facts), and the URL it was reached at."""
    id: str | None = None
    host: str | None = None
    version: str | None = None
    os: str | None = None
    arch: str | None = None
    gpus: dict[str, Any] = Field(default_factory=dict)
    data_root: str | None = None
    url: str | None = None


class Pulled(Record):
    """What acceptance pulled by digest: the reference, its manifest digest, the image ID the engine made."""
    ref: ImageRef
    digest: str
    image_id: str
    engine: EngineFacts | None = None


class AcceptanceResult(Record):
    image_id: str
    container: dict[str, Any] = Field(default_factory=dict)
    gates: list[GateResult]
    environment: dict[str, Any] = Field(default_factory=dict)
    throughput: dict[str, Any] = Field(default_factory=dict)
    pulled: Annotated[Pulled | None, BeforeValidator(lambda v: v or None)] = None  # when pulled by digest


class PublishReceipt(Record):
    repository: ImageRef
    tags: list[str]
    digest: str
    config_digest: str
    verified: bool
    pushed_at: str
    platform: str = "unknown"          # os/architecture of the config blob the registry serves
    attestations: list[str] = Field(default_factory=list)  # digests of the signed artifacts referring to it


class SqshExport(Record):
    """The enroot .sqsh of the accepted image (builder/release/sqsh.py)."""
    path: str
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


class CompatPin(Record):
    """A compatibility pin as the report records it (from the pins' `compat`)."""
    package: str
    version: str
    reason: str


class Report(Record):
    verdict: Literal["ACCEPTED", "NOT ACCEPTED"]
    name: str
    sources: ResolvedSources
    build: BuiltImage | None = None
    acceptance: AcceptanceResult | None = None
    run_manifest: dict[str, Any] = Field(default_factory=dict)
    platform: str = "unknown"
    base_image: str = "unknown"
    publish: PublishReceipt | None = None
    sqsh: SqshExport | None = None
    # added by report.py: what the report is about and how the verdict was reached
    image_id: str = "unknown"
    repository: str = "unknown"
    tags: list[str] = Field(default_factory=list)      # sha tag first, then pins.image.tags
    required_gates: list[str] = Field(default_factory=list)
    gates: list[GateResult] = Field(default_factory=list)   # every gate; missing ones read not_run
    reasons: list[str] = Field(default_factory=list)  # why NOT ACCEPTED (empty when ACCEPTED)
    compat: list[CompatPin] = Field(default_factory=list)
    lock_sha256: str = "unknown"  # sha256 of the pins' build.lock (written by `builder lock`)
    created: str = ""
    rebuild: dict[str, Any] | None = None  # `builder rebuild --check`: digests compared, per-layer file diff
    processes: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)  # per recipe gate: the processes it ran


RECORDS: tuple[type[Record], ...] = (Submodule, ResolvedComponent, ResolvedSources, RenderedBuild, BuiltImage,
                                     GateResult, EngineFacts, Pulled, CompatPin, AcceptanceResult, PublishReceipt,
                                     SqshExport, Report)


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if getattr(annotation, "__origin__", None) is None else None
    return (text or str(annotation)).replace("typing.", "").replace("builder.core.records.", "")


def design_tables() -> str:
    """The Markdown tables DESIGN.md carries for every record (field, type, default)."""
    out = []
    for model in RECORDS:
        out += [f"#### `{model.__name__}`", "", "| field | type | default |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            default = "required" if field.is_required() else (
                "[]" if field.default_factory is list else "{}" if field.default_factory is dict
                else repr(field.default))
            out.append(f"| `{name}` | `{_type_name(field.annotation)}` | {default} |")
        out.append("")
    return "\n".join(out)

