"""The pins file: what to build (three PRs at exact commits on a base image by digest) and how to accept it.

`load(path)` reads the YAML strictly (duplicate keys refused), validates it against the `Pins` model and
turns any problem into one `BadInput` line: `<file>: <dotted.field>: <what was expected>`.
Every string that can reach a Dockerfile or a shell is checked against a whitelist regex.
Hostile input is bounded before it is walked (builder/pins/yamlguard.py), image references follow the
distribution grammar (builder/core/imageref.py), pip options and env names pass allow-lists
(builder/pins/allowlist.py); error lines show values escaped and elided (builder/core/safetext.py).
Regenerate the JSON Schema with `builder pins --schema > builder/pins/schema/pins.schema.json`.
"""
import hashlib
import json
import math
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from acceptance import perf as perf_rule
from builder.core import imageref as reference
from builder.core.constants import COMPONENTS, DEFAULT_REQUIRED, GATES, METRICS
from builder.core.errors import BadInput
from builder.core.imageref import ImageRef
from builder.core.safetext import clip, show
from builder.pins import allowlist, inputfile, yamlguard

# Whitelists (full match). None of them admits newline, quote, backslash, $, backtick, ; & | < > or space.
SAFE = r"[A-Za-z0-9_.,:/=+@%-]"
RX = {
    "name": r"[a-z0-9][a-z0-9._-]{0,127}",
    "cache_scope": r"[a-z0-9][a-z0-9._@/:-]{0,383}",
    "repository": reference.NAME,
    "tag": reference.TAG,
    "base_image": rf"{reference.NAME}(:{reference.TAG})?@{reference.SHA256}",
    "python": r"3\.[0-9]{1,2}",
    "abs_path": r"(/[A-Za-z0-9_.+@-]+)+",
    "node_path": r"(/([A-Za-z0-9_.+@-]|%n)+)+",  # an absolute path where %n stands for the node's name
    # normalised, to a file: no '.' or '..' segment, no '//', no trailing '/', not '/' itself
    "file_path": r"(/(?!\.\.?(/|$))[A-Za-z0-9_.+@-]+)+",
    "rel_path": r"[A-Za-z0-9_.+@][A-Za-z0-9_.+@-]*(/[A-Za-z0-9_.+@-]+)*",
    "branch": r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,200}",
    "commit": r"[0-9a-f]{40}",
    "distribution": r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?",
    "version": r"[0-9A-Za-z][0-9A-Za-z.+!-]{0,63}",
    "module": r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
    "pip_arg": r"--?[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/=+-]*)?",
    "env_name": r"[A-Z_][A-Z0-9_]*",
    # env values go into ENV lines and container env, always quoted; single inner spaces allowed
    # because TORCH_CUDA_ARCH_LIST is space-separated ("9.0 10.0") and ';' is refused everywhere.
    "env_value": rf"({SAFE}+( {SAFE}+)*)?",
    "token": rf"{SAFE}+",
    "override_key": r"\+?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
    "metric": r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,127}",
    "reason": r"[A-Za-z0-9(][A-Za-z0-9 .,:()/+_#@=-]{0,299}",
    "layout": r"([A-Za-z0-9_.+@-]|\{step\})+(/([A-Za-z0-9_.+@-]|\{step\})+)*",
    "tensor_pattern": r"[A-Za-z0-9_.*?\[\]-]{1,200}",
    "device": r"[a-z][a-z0-9_]{0,31}",
    "slurm_name": r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}",
    # an extra srun flag: --name or --name=value (values from SAFE); the flags the tool sets itself are refused
    "srun_arg": r"--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/=+@%-]+)?",
    "engine": r"(unix://(/[A-Za-z0-9_.+@-]+)+|(tcp|ssh)://([A-Za-z0-9_.-]+@)?[A-Za-z0-9_.-]+(:[0-9]{1,5})?)",
}
URL_RX = [
    r"https?://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?(/[A-Za-z0-9_.~%+-]+)+/?",
    r"ssh://([A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?(/[A-Za-z0-9_.~%+-]+)+/?",
    r"[A-Za-z0-9_][A-Za-z0-9_.-]*@[A-Za-z0-9][A-Za-z0-9.-]*:[A-Za-z0-9_.~+][A-Za-z0-9_.~/+-]*",
    r"file://" + RX["abs_path"],
    RX["abs_path"],  # a plain absolute path, as git accepts it
]
# documented ranges (docs/pins.md, Rules)
STEPS = (2, 100_000)       # the gate timeout bounds the wall time
TIMEOUT_S = (1, 86_400)
GPUS = (0, 64)
REPEATS = (1, 50)           # performance runs per arm
MIN_PAIRS = (2, 50)         # performance pairs before the gate may stop
LR = (0.0, 10.0)            # the rl_step learning rate: finite, > 0 and at most 10
SHAREABLE = ("url", "commit", "distribution")
# host paths a gate must never see: the whole host, the engine, kernel interfaces, devices
MOUNT_REFUSED = ("/proc", "/sys", "/dev", "/var/lib/docker", "/var/lib/containerd", "/run/docker.sock",
                 "/var/run/docker.sock", "/run/containerd", "/var/run/containerd", "/run/docker",
                 "/var/run/docker", "/etc", "/boot", "/root")


def _match(kind: str, value: str) -> bool:
    return isinstance(value, str) and re.fullmatch(RX[kind], value) is not None


def _check(kind: str, what: str) -> Callable[[str], str]:
    """A validator: the value must fully match RX[kind]; `what` goes into the error message."""

    def check(value: str) -> str:
        if not _match(kind, value):
            raise ValueError(f"expected {what}, got {show(value)}")
        if kind not in ("pip_arg", "token") and value.startswith("-"):
            raise ValueError(f"expected {what} not starting with '-', got {show(value)}")
        return value

    return check


def _schema(kind: str) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "pattern": f"^{RX[kind]}$"})


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    return value


def _number(value: Any) -> Any:
    """A number as written (0.5 or 2, not '0.5', true, .nan or .inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {show(value)}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {show(value)}")
    return value


def _int_only(value: Any) -> Any:
    """An integer as written (1, not 1.0 or true)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {show(value)}")
    return value


def _ranged(low: int, high: int, what: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        _int_only(value)
        if not low <= value <= high:
            raise ValueError(f"expected {what} in {low}..{high}, got {show(value)}")
        return value

    return BeforeValidator(check)


def _range_schema(low: int, high: int) -> WithJsonSchema:
    return WithJsonSchema({"type": "integer", "minimum": low, "maximum": high})


def _repository(value: Any) -> reference.Repository:
    if not isinstance(value, str):
        raise ValueError(f"expected a string host[:port]/path, got {type(value).__name__}")
    try:
        return reference.Repository(value)
    except ValueError as exc:
        raise ValueError(f"expected a registry host[:port]/path without tag or digest,"
                         f" like '127.0.0.1:5000/demo/unified': {exc}") from None


def _tag(value: str) -> str:
    return reference.check_tag(value)


def _env_name(value: str) -> str:
    return allowlist.check_env_name(value)


def _shareable(value: str) -> str:
    if value not in SHAREABLE:
        raise ValueError(f"expected one of {', '.join(SHAREABLE)}, got {show(value)}")
    return value


Name = Annotated[str, _schema("name"), AfterValidator(_check(
    "name", "a lowercase name like 'demo-true-on-policy'"))]
CacheScope = Annotated[str, _schema("cache_scope"), AfterValidator(_check(
    "cache_scope", "a lowercase scope like 'demo-true-on-policy@127.0.0.1:5000/demo/unified'"))]
Repository = Annotated[reference.Repository, PlainValidator(_repository), WithJsonSchema(
    {"type": "string", "pattern": f"^{RX['repository']}$", "maxLength": reference.NAME_MAX})]
Tag = Annotated[str, _schema("tag"), AfterValidator(_tag)]
AbsPath = Annotated[str, _schema("abs_path"), AfterValidator(_check(
    "abs_path", "an absolute path of [A-Za-z0-9_.+@-] segments"))]
FilePath = Annotated[str, _schema("file_path"), AfterValidator(_check(
    "file_path", "an absolute normalised path to a file like '/opt/venv/bin/python' (no '.' or '..' segment, "
    "no trailing '/')"))]
Branch = Annotated[str, _schema("branch"), AfterValidator(_check(
    "branch", "a git branch name like 'main'"))]
Distribution = Annotated[str, _schema("distribution"), AfterValidator(_check(
    "distribution", "a pip distribution name like 'megatron-core'"))]
Version = Annotated[str, _schema("version"), AfterValidator(_check(
    "version", "a version like '0.6.2'"))]
Module = Annotated[str, _schema("module"), AfterValidator(_check(
    "module", "a dotted import name like 'megatron.core'"))]
EnvName = Annotated[str, _schema("env_name"), AfterValidator(_check(
    "env_name", "an env var name matching [A-Z_][A-Z0-9_]*")), AfterValidator(_env_name)]
EnvValue = Annotated[str, _schema("env_value"), AfterValidator(_check(
    "env_value", "an env value of [A-Za-z0-9_.,:/=+@%-] (single inner spaces allowed)"))]
Token = Annotated[str, _schema("token"), AfterValidator(_check(
    "token", "an argv word of [A-Za-z0-9_.,:/=+@%-]"))]
OverrideKey = Annotated[str, _schema("override_key"), AfterValidator(_check(
    "override_key", "an override key like 'a.b_c.d' or '+a.b'"))]
Metric = Annotated[str, _schema("metric"), AfterValidator(_check(
    "metric", "a metric name like 'training/rollout_probs_diff_max'"))]
Reason = Annotated[str, _schema("reason"), AfterValidator(_check(
    "reason", "a one-line reason of letters, digits, spaces and .,:()/+_#@=-"))]
Engine = Annotated[str, _schema("engine"), AfterValidator(_check(
    "engine", "a Docker engine URL: unix:///path, tcp://host:port or ssh://user@host"))]


def _gate(value: str) -> str:
    if value not in GATES:
        raise ValueError(f"expected one of {', '.join(GATES)}, got {value!r}")
    return value


GateName = Annotated[str, AfterValidator(_gate), WithJsonSchema({"type": "string", "enum": list(GATES)})]
Shareable = Annotated[str, AfterValidator(_shareable), WithJsonSchema({"type": "string", "enum": list(SHAREABLE)})]
PosInt = Annotated[int, BeforeValidator(_no_bool), Field(strict=True, gt=0)]
Env = dict[EnvName, EnvValue]
BuildEnv = dict[EnvName, Annotated[EnvValue, AfterValidator(allowlist.check_build_env_value)]]  # ENV lines


def _commit(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a full 40-hex commit SHA as a quoted string, got {show(value)}")
    if not re.fullmatch(RX["commit"], value):
        raise ValueError(f"expected a full 40-hex commit SHA, got {show(value)}")
    return value


def _pip_arg(value: str) -> str:
    return allowlist.check_pip_arg(value)


def _base_image(value: Any) -> ImageRef:
    if not isinstance(value, str):
        raise ValueError(f"expected a string name[:tag]@sha256:<64 lowercase hex>, got {type(value).__name__}")
    try:
        ref = ImageRef(value, need_digest=True)
        reference.hex_of(str(ref.digest))
    except ValueError as exc:
        raise ValueError(f"expected name[:tag]@sha256:<64 lowercase hex>: {exc}") from None
    if value != value.lower() or ref.registry.startswith("["):  # what FROM takes (render checks it again)
        raise ValueError("expected lowercase, and a registry host name or IPv4 address (the Dockerfile FROM"
                         f" form), got {show(value)}")
    return ref


def _inside(directory: Path, relative: str) -> Path:
    """Resolve `relative` against `directory` (symlinks followed); refuse anything that lands outside."""
    try:
        root = directory.resolve()
        target = (root / relative).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        raise ValueError(f"expected a path inside {show(str(directory), 80)}, got {show(relative)}"
                         " (a symlink loop)") from None
    if target != root and root not in target.parents:
        raise ValueError(f"expected a path inside {show(str(root), 80)}, got {show(relative)}"
                         f" (resolves to {show(str(target), 80)})")
    return target


def _directory(info: ValidationInfo) -> Path:
    context = info.context or {}
    return Path(context.get("directory") or ".")


def _unique(values: list[Any]) -> list[Any]:
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise ValueError(f"expected unique entries, got {show(seen[0])} twice")
    return values


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Image(Strict):
    repository: Repository
    tags: Annotated[list[Tag], AfterValidator(_unique)] = []
    staging: Repository | None = None  # where `builder run` pushes by digest; default <repository>-staging
    # which runs share the engine's layer cache (builder/image/render.py cache_key); default <name>@<repository>
    cache_scope: CacheScope | None = None


class Base(Strict):
    image: Annotated[ImageRef, PlainValidator(_base_image),
                     WithJsonSchema({"type": "string", "pattern": f"^{RX['base_image']}$"})]
    platform: Literal["linux/amd64", "linux/arm64"]
    python: Annotated[str, _schema("python"), AfterValidator(_check("python", "a quoted Python version like \"3.11\""))]
    python_bin: FilePath

    @property
    def name(self) -> str:
        """Registry and repository, without tag or digest."""
        return self.image.name

    @property
    def tag(self) -> str | None:
        return self.image.tag

    @property
    def digest(self) -> str:
        return str(self.image.digest)


class Install(Strict):
    pip_args: list[Annotated[str, AfterValidator(_pip_arg),
                             WithJsonSchema({"type": "string", "enum": sorted(allowlist.PIP_FLAGS)}
                                            if not allowlist.PIP_VALUED else
                                            {"anyOf": [{"enum": sorted(allowlist.PIP_FLAGS)}] + [
                                                {"type": "string", "pattern": f"^{k}=({v})$"}
                                                for k, v in sorted(allowlist.PIP_VALUED.items())]})]] = []
    env: BuildEnv = {}


CUDA_ARCH_RX = r"[0-9]{1,2}\.[0-9][af]?(\+PTX)?"
# the architectures CUDA 12.x and 13.x nvcc know (`nvcc --list-gpu-arch`, compute_XY as X.Y): 12.x has 5.0..9.0,
# 10.0, 10.1, 10.3 (12.9), 12.0, 12.1; 13.0 drops those below 7.5, adds 8.8 and 11.0 (10.1 renamed); the
# architecture-specific `a` and family `f` variants exist from 9.0a and 10.0f on (as nvcc -arch=compute_XYa/f takes them)
CUDA_ARCHS = ("5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.8", "8.9",
              "9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1")
CUDA_ARCHS_A = ("9.0a", "10.0a", "10.1a", "10.3a", "11.0a", "12.0a", "12.1a")
CUDA_ARCHS_F = ("10.0f", "10.1f", "10.3f", "11.0f", "12.0f", "12.1f")
CUDA_ARCH_KNOWN = frozenset(CUDA_ARCHS + CUDA_ARCHS_A + CUDA_ARCHS_F)
KNOB_ENV = ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS")


def _cuda_arch(value: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(CUDA_ARCH_RX, value):
        raise ValueError(f"expected a CUDA arch like '9.0', '10.0a' or '8.0+PTX', got {show(value)}")
    if value.removesuffix("+PTX") not in CUDA_ARCH_KNOWN:
        raise ValueError(f"expected a CUDA arch nvcc 12.x/13.x knows, got {show(value)}: 5.0 5.2 5.3 6.0-6.2"
                         " 7.0 7.2 7.5 8.0 8.6-8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1; a/f: 10.0 up (a: 9.0 too); +PTX")
    return value


CudaArch = Annotated[str, AfterValidator(_cuda_arch),
                     WithJsonSchema({"type": "string", "pattern": f"^{CUDA_ARCH_RX}$"})]
Device = Annotated[str, _schema("device"), AfterValidator(_check("device", "a target device like 'cpu' or 'cuda'"))]


class Native(Strict):
    """A component's native build: the knobs it is built with (each passed as env, recorded in the
    manifest and report) and the native modules the smoke step loads."""
    device: Device | None = None            # the target device, e.g. cpu or cuda
    device_var: EnvName | None = None       # the variable carrying it (env, and the CMake variable), e.g. VLLM_TARGET_DEVICE
    cuda_arch: Annotated[list[CudaArch], AfterValidator(_unique)] = []  # TORCH_CUDA_ARCH_LIST
    max_jobs: Annotated[int, _ranged(1, 1024, "a job count"), _range_schema(1, 1024)] | None = None
    nvcc_threads: Annotated[int, _ranged(1, 64, "a thread count"), _range_schema(1, 64)] | None = None
    modules: Annotated[list[Module], AfterValidator(_unique)] = []  # native modules smoke imports
    # CMake facts of the build host the lock cannot read from the files (vLLM's ASIMD_FOUND comes from
    # the build machine's /proc/cpuinfo): they decide which FetchContent declarations apply
    cmake_vars: Env = {}

    @model_validator(mode="after")
    def _device(self) -> "Native":
        if self.device is None and self.device_var is not None:
            raise ValueError(f"device: required with device_var ({self.device_var} carries it): the target device,"
                             " like 'cpu' or 'cuda'")
        if self.device_var is None and self.device is not None:
            raise ValueError("device_var: required with device: the variable that carries it, like"
                             " VLLM_TARGET_DEVICE")
        if self.cuda_arch and self.device != "cuda":
            raise ValueError(f"cuda_arch: expected only with device 'cuda', got device {show(self.device)}")
        if self.device == "cuda" and not self.cuda_arch:
            raise ValueError("cuda_arch: expected the arch list the kernels are built for (device 'cuda')")
        return self

    def env(self) -> dict[str, str]:
        """The build environment these knobs set."""
        out: dict[str, str] = {}
        if self.device is not None and self.device_var is not None:
            out[self.device_var] = self.device
        if self.cuda_arch:
            out["TORCH_CUDA_ARCH_LIST"] = " ".join(self.cuda_arch)
        if self.max_jobs is not None:
            out["MAX_JOBS"] = str(self.max_jobs)
        if self.nvcc_threads is not None:
            out["NVCC_THREADS"] = str(self.nvcc_threads)
        return out


class Component(Strict):
    url: Annotated[str, WithJsonSchema({"type": "string"})]
    target: Branch
    pr: PosInt
    commit: Annotated[str, BeforeValidator(_commit),
                      WithJsonSchema({"type": "string", "pattern": f"^{RX['commit']}$"})]
    distribution: Distribution
    modules: Annotated[list[Module], Field(min_length=1), AfterValidator(_unique)]
    install: Install = Install()
    native: Native | None = None
    base_torch: bool = False  # build against the base's torch: exact torch/torchvision/torchaudio pins relaxed

    @model_validator(mode="after")
    def _knobs(self) -> "Component":
        both = sorted(set(self.native.env() if self.native else {}) & set(self.install.env))
        if both:
            raise ValueError(f"install.env: expected {both[0]} set once, by native (it sets {', '.join(both)})")
        return self

    def build_env(self) -> dict[str, str]:
        """install.env plus the native knobs' env."""
        return {**self.install.env, **(self.native.env() if self.native else {})}

    @field_validator("url")
    @classmethod
    def _url(cls, value: str, info: ValidationInfo) -> str:
        if any(re.fullmatch(rx, value) for rx in URL_RX):
            return value
        if "://" not in value and _match("rel_path", value):
            _inside(_directory(info), value)
            return value
        raise ValueError("expected https://, http://, ssh://, git@host:path, file:///abs, /abs or a path"
                         f" relative to the pins file's directory, got {show(value)}")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        if ".." in value or "//" in value or value.endswith(("/", ".", ".lock")):
            raise ValueError(f"expected a valid git branch name, got {show(value)}")
        return value


class Components(Strict):
    vllm: Component
    megatron: Component
    verl: Component

    def __getitem__(self, name: str) -> Component:
        if name not in COMPONENTS:
            raise KeyError(name)
        component: Component = getattr(self, name)
        return component

    def items(self) -> list[tuple[str, Component]]:
        return [(name, getattr(self, name)) for name in COMPONENTS]


class Compat(Strict):
    package: Distribution
    version: Version
    reason: Reason


class DirectUrl(Strict):
    """A direct-URL requirement (`name @ url`) of a component, locked instead as package==version from
    the index (with its hash), for the reason given."""
    package: Distribution
    version: Version
    reason: Reason


class Build(Strict):
    env: BuildEnv = {}
    lock: Annotated[str, WithJsonSchema({"type": "string", "pattern": f"^{RX['rel_path']}$"})]
    constraints: Annotated[list[Distribution], AfterValidator(_unique)] = []

    @field_validator("lock")
    @classmethod
    def _lock(cls, value: str, info: ValidationInfo) -> str:
        if not _match("rel_path", value):
            raise ValueError(f"expected a path relative to the pins file's directory, got {show(value)}")
        path = _inside(_directory(info), value)
        try:
            inputfile.read_text(path, "lock file", LOCK_MAX_BYTES)
        except BadInput as exc:
            raise ValueError(f"expected an existing lock file (regular, UTF-8): {exc}") from None
        return value


def _override_value(value: Any) -> Any:
    scalars = (str, int, float, bool)
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, scalars) or (isinstance(item, str) and not _match("token", item)):
            raise ValueError(f"expected a scalar or a list of scalars (strings of {SAFE}), got {show(value)}")
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"expected a finite number, got {show(value)}")
    return value


Scalar = {"type": ["string", "number", "boolean"]}
OverrideValue = Annotated[Any, AfterValidator(_override_value),
                          WithJsonSchema({"anyOf": [Scalar, {"type": "array", "items": Scalar}]})]


def _format(value: Any) -> str:
    """Hydra command-line form of one override value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_format(v) for v in value) + "]"
    return str(value)


def _program_first(value: list[str]) -> list[str]:
    if value[0].startswith("-"):
        raise ValueError(f"expected a program as the first word, got {show(value[0])}")
    return value


Command = Annotated[list[Token], Field(min_length=1), AfterValidator(_program_first)]  # a program, then its words


class Rollout(Strict):
    """recipe.rollout: the rollout engine as a server of its own, for acceptance.nodes 2. The rollout node runs
    `entry --host HOST --port PORT`; the trainer gets `address_key=HOST:PORT`; both read the shared key from
    `authkey_env`."""
    entry: Command
    address_key: OverrideKey = "actor_rollout_ref.rollout.address"
    authkey_env: EnvName = "ROLLOUT_AUTHKEY"


class Recipe(Strict):
    entry: Command
    overrides: dict[OverrideKey, OverrideValue] = {}
    env: Env = {}
    aligned_env: Annotated[Env, Field(min_length=1)]
    control_env: Annotated[Env, Field(min_length=1)]
    rollout: Rollout | None = None  # the rollout engine on a node of its own (acceptance.nodes 2)


class Metrics(Strict):
    diff_max: Metric = METRICS["diff_max"]
    diff_mean: Metric = METRICS["diff_mean"]
    k3_kl: Metric = METRICS["k3_kl"]
    reward: Metric = METRICS["reward"]
    loss: Metric = METRICS["loss"]
    weights_before: Metric = METRICS["weights_before"]
    weights_after: Metric = METRICS["weights_after"]
    throughput: Metric = METRICS["throughput"]


def _mount_source(value: str) -> str:
    """Normalised (`/etc/..` is `/`); `/`, the engine's socket and data root, /proc, /sys, /dev and the
    like are refused, and so is any folder above one of them (mounting /var shows /var/run/docker.sock)."""
    clean = normal_path(value)
    paths = [clean]
    try:
        real = str(Path(clean).resolve())  # a symlink on this host pointing at one of them
        if real != clean:
            paths.append(real)
    except (OSError, RuntimeError):
        raise ValueError(f"expected a mountable host path, got {show(value)} (a symlink loop)") from None
    for path in paths:
        for bad in MOUNT_REFUSED:
            if path == "/" or path == bad or path.startswith(bad + "/") or bad.startswith(path + "/"):
                shown = f"{show(value)} (that is {show(path)})" if path != value else show(value)
                raise ValueError(f"expected a host path away from {bad}; mounting {shown} exposes the host"
                                 " or the engine")
        if path.endswith(".sock"):
            raise ValueError(f"expected a data folder, got the socket {show(value)}")
    return value


def _mount_target(value: str) -> str:
    clean = normal_path(value)
    if clean == "/" or any(clean == p or clean.startswith(p + "/") for p in ("/proc", "/sys", "/dev")):
        raise ValueError(f"expected a target folder inside the container, got {show(value)} (that is {show(clean)})")
    return value


def check_mounts(pins: "Pins", data_root: str | None) -> None:
    """At acceptance: no mount source may be, hold or sit inside the engine's data root (`docker info`)."""
    if not data_root:
        return
    root = normal_path(data_root)
    sources = [(f"acceptance.mounts[{i}].source", m.source) for i, m in enumerate(pins.acceptance.mounts)]
    checkpoint = pins.acceptance.checkpoint
    if checkpoint is not None and checkpoint.scratch:
        sources.append(("acceptance.checkpoint.scratch", checkpoint.scratch))
    for field, source in sources:
        for path in {normal_path(source), str(Path(normal_path(source)).resolve())}:
            if path == root or path.startswith(root + "/") or root.startswith(path.rstrip("/") + "/"):
                raise BadInput(clip(f"{pins.path}: {field}: {show(source)} exposes"
                                    f" the engine's data root {show(root)}; refusing"))


def normal_path(value: str) -> str:
    """`/a/./b/../c` -> `/a/c`; `//x` -> `/x` (POSIX keeps a leading `//`; the engine does not)."""
    clean = posixpath.normpath(value)
    return "/" + clean.lstrip("/")


class Mount(Strict):
    """Always mounted read-only; there is no mode field on purpose."""
    source: Annotated[AbsPath, AfterValidator(_mount_source)]
    target: Annotated[AbsPath, AfterValidator(_mount_target)]


Layout = Annotated[str, _schema("layout"), AfterValidator(_check(
    "layout", "a relative path with {step}"))]
TensorPattern = Annotated[str, _schema("tensor_pattern"), AfterValidator(_check(
    "tensor_pattern", "a tensor-name glob like 'model.norm.*'"))]


def _layout(value: str) -> str:
    if value.count("{step}") != 1 or ".." in value.split("/"):
        raise ValueError(f"expected a relative path with one {{step}}, like 'global_step_{{step}}/actor',"
                         f" got {value!r}")
    return value


class Checkpoint(Strict):
    """acceptance.weights = checkpoint: the recipe's own options that save the actor weights every step."""
    overrides: Annotated[dict[OverrideKey, OverrideValue], Field(min_length=1)]
    dir_key: OverrideKey = "trainer.default_local_dir"
    dir: AbsPath = "/tmp/acceptance/checkpoints"     # in the container: the /tmp tmpfs, or `scratch` mounted here
    # host directory mounted read-write at `dir`; checked like the read-only mounts' sources
    scratch: Annotated[AbsPath, AfterValidator(_mount_source)] | None = None
    layout: Annotated[Layout, AfterValidator(_layout)] = "global_step_{step}/actor/huggingface"
    model_path_key: OverrideKey | None = "actor_rollout_ref.model.path"
    may_stay: list[TensorPattern] = []

    @model_validator(mode="after")
    def _where(self) -> "Checkpoint":
        if self.dir_key in self.overrides:
            raise ValueError(f"overrides: expected no {self.dir_key} (dir_key; the suite sets it per gate)")
        in_tmpfs = self.dir == "/tmp" or self.dir.startswith("/tmp/")
        if self.scratch is None and not in_tmpfs:
            raise ValueError(f"dir: expected a path under the /tmp tmpfs unless scratch is set, got {self.dir!r}")
        if self.scratch is not None and (in_tmpfs or self.dir == "/cache" or self.dir.startswith("/cache/")):
            raise ValueError("dir: expected a path outside the tmpfs mounts (/tmp, /cache) for a scratch mount,"
                             f" got {self.dir!r}")
        return self


class Performance(Strict):
    """The performance gate: pairs of runs (aligned, then control), each in a fresh container; a run's value is the
    median of its steps' `metric`. A sequential test on the pairs' ratios (acceptance/perf.py) stops with pass when
    its lower bound at `confidence` is at least `min_ratio`, with fail when its upper bound is below it, and runs
    another pair otherwise: at least `min_pairs`, at most `repeats` pairs, then inconclusive. `max_spread` only
    names an arm as noisy in that reason. `reason` says where min_ratio comes from."""
    metric: Metric | None = None    # default: acceptance.metrics.throughput
    min_ratio: Annotated[float, BeforeValidator(_number), Field(gt=0, le=100)]
    repeats: Annotated[int, _ranged(*REPEATS, "runs per arm"), _range_schema(*REPEATS)] = 3
    min_pairs: Annotated[int, _ranged(*MIN_PAIRS, "pairs before the gate may stop"), _range_schema(*MIN_PAIRS)] = 2
    confidence: Annotated[float, BeforeValidator(_number), Field(ge=0.5, le=0.999)] = 0.95
    max_spread: Annotated[float, BeforeValidator(_number), Field(ge=1, le=100)] = 1.5
    # steps of each run (default acceptance.steps); a run's value is the median of its steps' metric
    steps: Annotated[int, _ranged(*STEPS, "a step count"), _range_schema(*STEPS)] | None = None
    reason: Reason

    @model_validator(mode="after")
    def _pairs(self) -> "Performance":
        if self.min_pairs > self.repeats:
            raise ValueError(f"min_pairs: expected at most repeats ({self.repeats}), got {self.min_pairs}")
        return self

    def rule(self, min_ratio: float | None = None) -> perf_rule.Rule:
        """The sequential rule's settings (min_ratio: another floor, as nightly's regression flag uses)."""
        return perf_rule.Rule(min_ratio=self.min_ratio if min_ratio is None else min_ratio,
                              confidence=self.confidence, min_pairs=self.min_pairs, max_pairs=self.repeats,
                              max_spread=self.max_spread)


SRUN_OWN = ("--jobid", "--job-name", "--time", "--container-", "--export", "--output", "--error", "--input",
            "--chdir", "--nodes", "--ntasks", "--kill-on-bad-exit", "--uid", "--gid", "--pty", "--overlap")
SlurmName = Annotated[str, _schema("slurm_name"), AfterValidator(_check(
    "slurm_name", "a Slurm partition/account/QoS name (letters, digits, _ . -)"))]


def _srun_arg(value: str) -> str:
    if not _match("srun_arg", value):
        raise ValueError(f"expected an srun flag like --constraint=a100 (--name or --name=value), got {show(value)}")
    if value.split("=")[0].startswith(SRUN_OWN):
        raise ValueError(f"expected an srun flag the builder does not set itself, got {show(value)}")
    return value


SrunArg = Annotated[str, _schema("srun_arg"), AfterValidator(_srun_arg)]


class Slurm(Strict):
    """Cluster acceptance (`--slurm`): where the gates' steps run and where the .sqsh is shared."""
    partition: SlurmName | None = None
    account: SlurmName | None = None
    qos: SlurmName | None = None
    # the longest allocation the site grants (its partition's MaxTime): a plan whose allocation (the gates'
    # limits, the node check and the margin: builder/gating/plan.py) is longer is refused before submitting
    allocation_limit_s: Annotated[int, _ranged(60, 7 * 86_400, "seconds"), _range_schema(60, 7 * 86_400)] | None = None
    # node-local disk (enroot's/pyxis' cache): each node copies the .sqsh there by sha256 under a lock, checks it
    # and mounts that copy; default: every node mounts the shared file
    node_local_dir: Annotated[str, _schema("node_path"), AfterValidator(_check(
        "node_path", "an absolute path (%n: the node's name)"))] | None = None
    srun_args: list[SrunArg] = []
    # a directory the submit host and the compute nodes share; default <cache>/cluster-images
    shared_dir: Annotated[str, _schema("abs_path"), AfterValidator(_check("abs_path", "an absolute path"))] | None = None
    runtime: Literal["charliecloud", "enroot"] = "charliecloud"
    # where `publish` places the accepted .sqsh (+ .sha256) under the SHA tag; default: where it was accepted
    publish_dir: Annotated[str, _schema("abs_path"), AfterValidator(_check("abs_path", "an absolute path"))] | None = None

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "time_limit_s" in data:
            raise ValueError("time_limit_s: no longer read: each gate's limit is acceptance.timeout_s (or --timeout);"
                             " the site's allocation cap is allocation_limit_s")
        return data


class Acceptance(Strict):
    steps: Annotated[int, _ranged(*STEPS, "a step count"), _range_schema(*STEPS)] = 2
    steps_key: OverrideKey = "trainer.total_training_steps"
    lr_key: OverrideKey = "actor_rollout_ref.actor.optim.lr"
    timeout_s: Annotated[int, _ranged(*TIMEOUT_S, "seconds per gate"), _range_schema(*TIMEOUT_S)] = 900
    gpus: Annotated[int, _ranged(*GPUS, "a GPU count"), _range_schema(*GPUS)] = 0
    # nodes the recipe spans: 2 puts the rollout engine on another node than the trainer (recipe.rollout)
    nodes: Annotated[int, _ranged(1, 64, "a node count"), _range_schema(1, 64)] = 1
    mounts: list[Mount] = []
    metrics: Metrics = Metrics()
    required_gates: Annotated[list[GateName], Field(min_length=1), AfterValidator(_unique)] = list(DEFAULT_REQUIRED)
    performance: Performance | None = None  # named here: the performance gate runs and is required
    weights: Literal["metrics", "checkpoint", "none"] = "metrics"   # where weight evidence comes from
    checkpoint: Checkpoint | None = None
    engine: Engine | None = None  # run the gates on this engine, pulled by digest; default: DOCKER_HOST
    slurm: Slurm = Slurm()        # with --slurm: the Slurm options of the gates

    @field_validator("mounts")
    @classmethod
    def _targets(cls, value: list[Mount]) -> list[Mount]:
        _unique([normal_path(m.target) for m in value])
        return value

    @model_validator(mode="after")
    def _checkpoint(self) -> "Acceptance":
        if self.weights == "checkpoint" and self.checkpoint is None:
            raise ValueError("checkpoint: expected the recipe's checkpoint options when weights is 'checkpoint'")
        if "performance" in self.required_gates and self.performance is None:
            raise ValueError("required_gates: names performance, but acceptance.performance (metric, min_ratio,"
                             " repeats, max_spread, reason) is not set")
        if self.performance is not None and "performance" not in self.required_gates:
            self.required_gates = [*self.required_gates, "performance"]  # named in the pins: required
        return self

    def performance_metric(self) -> str:
        perf = self.performance
        return perf.metric if perf is not None and perf.metric else self.metrics.throughput


class Nightly(Strict):
    """`builder nightly`: regression threshold on the throughput ratio and how many nightly-* tags to keep."""
    regression_threshold: Annotated[float, BeforeValidator(_number), Field(ge=0, lt=1)] = 0.05
    retention: Annotated[int, BeforeValidator(_no_bool), Field(strict=True, ge=1)] = 7


def _unique_distributions(values: list["RuntimeLibrary"]) -> list["RuntimeLibrary"]:
    _unique([v.distribution.lower() for v in values])
    return values


class RuntimeLibrary(Strict):
    """A native runtime library the report records on its own (six layers): by distribution, with its import root
    where it has one, or the component whose build it is a native input of (FlashAttention, DeepGEMM in vLLM)."""
    distribution: Distribution
    import_root: Module | None = None
    built_into: Literal["vllm", "megatron", "verl"] | None = None


class Pins(Strict):
    schema_version: Annotated[Literal[1], BeforeValidator(_int_only)]
    name: Name
    image: Image
    base: Base
    components: Components
    compat: list[Compat] = []
    direct_urls: list[DirectUrl] = []
    build: Build
    recipe: Recipe
    acceptance: Acceptance = Acceptance()
    # components must differ in url, commit and distribution unless named here (the report shows it)
    shared: Annotated[list[Shareable], AfterValidator(_unique)] = []
    nightly: Nightly = Nightly()
    # native runtime libraries the report records each with its six layers (docs/gates.md)
    runtime_libraries: Annotated[list[RuntimeLibrary], AfterValidator(_unique_distributions)] = []

    _path: Path = PrivateAttr(default=Path())
    _sha256: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _cross_checks(self) -> "Pins":
        key, overrides = self.acceptance.lr_key, self.recipe.overrides
        lr = overrides.get(key)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) \
                or not LR[0] < lr <= LR[1]:
            raise ValueError(f"recipe.overrides[{key}]: expected a finite learning rate in ({LR[0]:g}, {LR[1]:g}]"
                             f" (acceptance.lr_key), got {show(lr)}")
        steps = overrides.get(self.acceptance.steps_key)
        if steps is not None and (isinstance(steps, bool) or steps != self.acceptance.steps):
            raise ValueError(f"recipe.overrides[{self.acceptance.steps_key}]: expected {self.acceptance.steps}"
                             f" (acceptance.steps), got {show(steps)}")
        if set(self.recipe.aligned_env) != set(self.recipe.control_env):
            raise ValueError("recipe.control_env: expected the same keys as recipe.aligned_env")
        if self.recipe.aligned_env == self.recipe.control_env:
            raise ValueError("recipe.control_env: expected at least one value that differs from aligned_env")
        both = set(self.recipe.env) & set(self.recipe.aligned_env)
        if both:
            raise ValueError(f"recipe.env: expected no key also set by aligned_env/control_env, got {show(sorted(both))}")
        rollout = self.recipe.rollout
        if self.acceptance.nodes > 1 and rollout is None:
            raise ValueError(f"acceptance.nodes: {self.acceptance.nodes} puts the rollout engine on a node of its own;"
                             " expected recipe.rollout (entry, address_key)")
        if rollout is not None and rollout.address_key in overrides:
            raise ValueError(f"recipe.overrides[{rollout.address_key}]: expected none (recipe.rollout.address_key;"
                             " the gates set it to the rollout node's address)")
        self._distinct()
        return self

    def _distinct(self) -> None:
        """Two components with the same URL, commit or distribution are one component twice, unless
        `shared` names that field."""
        for what in SHAREABLE:
            if what in self.shared:
                continue
            seen: dict[str, str] = {}
            for name, comp in self.components.items():
                value = getattr(comp, what)
                if what == "url":
                    value = value.rstrip("/").removesuffix(".git").lower()
                if what == "distribution":
                    value = re.sub(r"[-_.]+", "-", value).lower()
                if value in seen:
                    raise ValueError(f"components.{name}.{what}: expected a different {what} from"
                                     f" components.{seen[value]} (or list {what!r} under 'shared'),"
                                     f" got {show(getattr(comp, what))}")
                seen[value] = name

    @property
    def path(self) -> Path:
        return self._path

    @property
    def directory(self) -> Path:
        return self._path.parent if self._path else Path(".").resolve()

    @property
    def sha256(self) -> str:
        return self._sha256

    def component_url(self, name: str) -> str:
        url = self.components[name].url
        if any(re.fullmatch(rx, url) for rx in URL_RX):
            return url
        return str((self.directory / url).resolve())

    def lock_path(self) -> Path:
        return (self.directory / self.build.lock).resolve()

    def rl_lr(self) -> float:
        return float(self.recipe.overrides[self.acceptance.lr_key])

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ---- YAML: bounded, strict loading (builder/pins/yamlguard.py) ----

MAX_BYTES = yamlguard.MAX_BYTES
LOCK_MAX_BYTES = 16 * 1024 * 1024


def read_yaml(text: str) -> Any:
    """Parse pins YAML: limits, forbidden characters, duplicate keys (BadInput), YAML errors (yaml.YAMLError)."""
    return yamlguard.load_text(text)


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in str(part) and out:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model that holds the unknown key at `loc` (empty if not found)."""
    model: Any = Pins
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return []
        model = _inner(model.model_fields[part].annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _inner(model: Any) -> Any:
    """The model inside list[...], Annotated[...] and X | None."""
    while get_origin(model) in (list, Annotated, Union, UnionType):
        args = [a for a in get_args(model) if a is not type(None)]
        model = args[0] if args else model
    return model


FIELD_PREFIX = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z_][A-Za-z0-9_]*|\[[^\]]*\])*): (.*)", re.S)


def _field_in_message(loc: tuple[Any, ...], text: str) -> tuple[str, str]:
    """A model check's `field: what` names a field of the model at `loc`: the field joins the dotted path."""
    match = FIELD_PREFIX.fullmatch(text)
    if match and match[1] in _allowed_keys((*loc, "")):
        return _where((*loc, match[1])) + match[2], match[3]
    return _where(loc), text


def _one_line(exc: ValidationError) -> str:
    """First error as `<dotted.field>: <what was expected>`, plus a count of the others."""
    errors = exc.errors()
    err = errors[0]
    msg, kind, value, loc = err["msg"], err["type"], err.get("input"), tuple(err["loc"])
    place = _where(loc)
    if kind == "missing":
        text = "required field missing"
    elif kind == "extra_forbidden":
        allowed = _allowed_keys(loc)
        text = "unknown key" + (f" (expected one of: {', '.join(allowed)})" if allowed else "")
    elif kind == "value_error":
        place, text = _field_in_message(loc, msg.removeprefix("Value error, "))
    else:
        text = msg.replace("Input should be", "expected").replace("a valid integer", "an integer")
        text = text.replace("a valid ", "a ")
        if kind == "string_type":
            text += " (quote it in YAML)"
        if isinstance(value, (str, int, float, bool)) or value is None:
            text += f", got {show(value)}"
    where = show(place, 80)[1:-1]
    line = f"{where}: {text}" if where else text
    if len(errors) > 1:
        line += f" (and {len(errors) - 1} more)"
    return line


def validate(data: Any, directory: Path, label: str = "<pins>") -> Pins:
    """Validate parsed YAML; relative paths are checked against `directory`."""
    if not isinstance(data, dict):
        raise BadInput(f"{label}: expected a YAML mapping at the top level, got {type(data).__name__}")
    try:
        return Pins.model_validate(data, context={"directory": Path(directory)})
    except ValidationError as exc:
        raise BadInput(clip(f"{label}: {_one_line(exc)}")) from None


def load(path: str | Path) -> Pins:
    label = show(str(path), 120)[1:-1]
    raw = inputfile.read_bytes(path, "pins file", MAX_BYTES)
    text = inputfile.decode(raw, str(path), "pins file")
    try:
        data = read_yaml(text)
    except BadInput as exc:
        raise BadInput(clip(f"{label}: {exc}")) from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise BadInput(clip(f"{label}: {at}invalid YAML: {problem}")) from None
    absolute = Path(path).resolve()
    pins = validate(data, absolute.parent, label)
    pins._path = absolute
    pins._sha256 = hashlib.sha256(raw).hexdigest()
    return pins


def schema_json() -> str:
    schema = Pins.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Pins file (schema_version 1)"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
