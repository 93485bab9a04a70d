"""The pins file: what to build (three PRs at exact commits on a base image by digest) and how to accept it.

`load(path)` reads the YAML strictly (duplicate keys refused), validates it against the `Pins` model and
turns any problem into one `BadInput` line: `<file>: <dotted.field>: <what was expected>`.
Every string that can reach a Dockerfile or a shell is checked against a whitelist regex.
Regenerate the JSON Schema with `python -m builder.pins --schema > builder/schema/pins.schema.json`.
"""
import hashlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from builder.constants import COMPONENTS, GATES, METRICS
from builder.errors import BadInput

# Whitelists (full match). None of them admits newline, quote, backslash, $, backtick, ; & | < > or space.
SAFE = r"[A-Za-z0-9_.,:/=+@%-]"
RX = {
    "name": r"[a-z0-9][a-z0-9._-]{0,127}",
    "repository": r"(localhost|[a-z0-9][a-z0-9-]*(\.[a-z0-9-]+)+|[a-z0-9][a-z0-9.-]*:[0-9]{1,5})"
                  r"(/[a-z0-9]+([._-]+[a-z0-9]+)*)+",
    "tag": r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}",
    "base_image": r"[a-z0-9][a-z0-9.-]*(:[0-9]{1,5})?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
                  r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[0-9a-f]{64}",
    "python": r"3\.[0-9]{1,2}",
    "abs_path": r"(/[A-Za-z0-9_.+@-]+)+",
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
}
URL_RX = [
    r"https?://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?(/[A-Za-z0-9_.~%+-]+)+/?",
    r"ssh://([A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?(/[A-Za-z0-9_.~%+-]+)+/?",
    r"[A-Za-z0-9_][A-Za-z0-9_.-]*@[A-Za-z0-9][A-Za-z0-9.-]*:[A-Za-z0-9_.~+][A-Za-z0-9_.~/+-]*",
    r"file://" + RX["abs_path"],
]
# pip options that would change where packages come from or where they land (the lock decides that)
PIP_DENIED = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--trusted-host", "-r",
              "--requirement", "-c", "--constraint", "-e", "--editable", "-t", "--target", "--prefix",
              "--root", "--user", "--src", "--config-settings"}


def _match(kind: str, value: str) -> bool:
    return isinstance(value, str) and re.fullmatch(RX[kind], value) is not None


def _check(kind: str, what: str) -> Callable[[str], str]:
    """A validator: the value must fully match RX[kind]; `what` goes into the error message."""

    def check(value: str) -> str:
        if not _match(kind, value):
            raise ValueError(f"expected {what}, got {value!r}")
        if kind not in ("pip_arg", "token") and value.startswith("-"):
            raise ValueError(f"expected {what} not starting with '-', got {value!r}")
        return value

    return check


def _schema(kind: str) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "pattern": f"^{RX[kind]}$"})


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    return value


Name = Annotated[str, _schema("name"), AfterValidator(_check(
    "name", "a lowercase name like 'demo-true-on-policy'"))]
Repository = Annotated[str, _schema("repository"), AfterValidator(_check(
    "repository", "a registry host[:port]/path without tag or digest, like '127.0.0.1:5000/demo/unified'"))]
Tag = Annotated[str, _schema("tag"), AfterValidator(_check(
    "tag", "an image tag of [A-Za-z0-9_.-], at most 128 characters"))]
AbsPath = Annotated[str, _schema("abs_path"), AfterValidator(_check(
    "abs_path", "an absolute path of [A-Za-z0-9_.+@-] segments"))]
Branch = Annotated[str, _schema("branch"), AfterValidator(_check(
    "branch", "a git branch name like 'main'"))]
Distribution = Annotated[str, _schema("distribution"), AfterValidator(_check(
    "distribution", "a pip distribution name like 'megatron-core'"))]
Version = Annotated[str, _schema("version"), AfterValidator(_check(
    "version", "a version like '0.6.2'"))]
Module = Annotated[str, _schema("module"), AfterValidator(_check(
    "module", "a dotted import name like 'megatron.core'"))]
EnvName = Annotated[str, _schema("env_name"), AfterValidator(_check(
    "env_name", "an env var name matching [A-Z_][A-Z0-9_]*"))]
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
def _gate(value: str) -> str:
    if value not in GATES:
        raise ValueError(f"expected one of {', '.join(GATES)}, got {value!r}")
    return value


GateName = Annotated[str, AfterValidator(_gate), WithJsonSchema({"type": "string", "enum": list(GATES)})]
PosInt = Annotated[int, BeforeValidator(_no_bool), Field(strict=True, gt=0)]
Env = dict[EnvName, EnvValue]


def _commit(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a full 40-hex commit SHA as a quoted string, got {value!r}")
    if not re.fullmatch(RX["commit"], value):
        raise ValueError(f"expected a full 40-hex commit SHA, got {value!r}")
    return value


def _pip_arg(value: str) -> str:
    if not _match("pip_arg", value):
        raise ValueError(f"expected a pip option like '--no-deps' or '--opt=value', got {value!r}")
    if value.split("=", 1)[0] in PIP_DENIED:
        raise ValueError(f"expected a pip option that keeps the lock's sources and install location, got {value!r}")
    return value


def _base_image(value: str) -> str:
    if not _match("base_image", value):
        raise ValueError(f"expected name[:tag]@sha256:<64 lowercase hex> (a digest; tags alone move), got {value!r}")
    return value


def _inside(directory: Path, relative: str) -> Path:
    """Resolve `relative` against `directory` (symlinks followed); refuse anything that lands outside."""
    root = directory.resolve()
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise ValueError(f"expected a path inside {root}, got {relative!r} (resolves to {target})")
    return target


def _directory(info: ValidationInfo) -> Path:
    context = info.context or {}
    return Path(context.get("directory") or ".")


def _unique(values: list) -> list:
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise ValueError(f"expected unique entries, got {seen[0]!r} twice")
    return values


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Image(Strict):
    repository: Repository
    tags: Annotated[list[Tag], AfterValidator(_unique)] = []


class Base(Strict):
    image: Annotated[str, AfterValidator(_base_image),
                     WithJsonSchema({"type": "string", "pattern": f"^{RX['base_image']}$"})]
    platform: Literal["linux/amd64", "linux/arm64"]
    python: Annotated[str, _schema("python"), AfterValidator(_check("python", "a quoted Python version like \"3.11\""))]
    python_bin: AbsPath

    @property
    def name(self) -> str:
        """Repository part, without tag or digest."""
        ref = self.image.split("@", 1)[0]
        head, _, last = ref.rpartition("/")
        return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]

    @property
    def tag(self) -> str | None:
        ref = self.image.split("@", 1)[0]
        last = ref.rpartition("/")[2]
        return last.split(":", 1)[1] if ":" in last else None

    @property
    def digest(self) -> str:
        return self.image.split("@", 1)[1]


class Install(Strict):
    pip_args: list[Annotated[str, AfterValidator(_pip_arg),
                             WithJsonSchema({"type": "string", "pattern": f"^{RX['pip_arg']}$"})]] = []
    env: Env = {}


class Component(Strict):
    url: Annotated[str, WithJsonSchema({"type": "string"})]
    target: Branch
    pr: PosInt
    commit: Annotated[str, BeforeValidator(_commit),
                      WithJsonSchema({"type": "string", "pattern": f"^{RX['commit']}$"})]
    distribution: Distribution
    modules: Annotated[list[Module], Field(min_length=1), AfterValidator(_unique)]
    install: Install = Install()

    @field_validator("url")
    @classmethod
    def _url(cls, value: str, info: ValidationInfo) -> str:
        if any(re.fullmatch(rx, value) for rx in URL_RX):
            return value
        if "://" not in value and _match("rel_path", value):
            _inside(_directory(info), value)
            return value
        raise ValueError("expected https://, http://, ssh://, git@host:path, file:///abs or a path"
                         f" relative to the pins file's directory, got {value!r}")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        if ".." in value or "//" in value or value.endswith(("/", ".", ".lock")):
            raise ValueError(f"expected a valid git branch name, got {value!r}")
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


class Build(Strict):
    env: Env = {}
    lock: Annotated[str, WithJsonSchema({"type": "string", "pattern": f"^{RX['rel_path']}$"})]
    constraints: Annotated[list[Distribution], AfterValidator(_unique)] = []

    @field_validator("lock")
    @classmethod
    def _lock(cls, value: str, info: ValidationInfo) -> str:
        if not _match("rel_path", value):
            raise ValueError(f"expected a path relative to the pins file's directory, got {value!r}")
        path = _inside(_directory(info), value)
        if not path.is_file():
            raise ValueError(f"expected an existing lock file, {path} does not exist")
        return value


def _override_value(value: Any) -> Any:
    scalars = (str, int, float, bool)
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, scalars) or (isinstance(item, str) and not _match("token", item)):
            raise ValueError(f"expected a scalar or a list of scalars (strings of {SAFE}), got {value!r}")
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


class Recipe(Strict):
    entry: Annotated[list[Token], Field(min_length=1)]
    overrides: dict[OverrideKey, OverrideValue] = {}
    env: Env = {}
    aligned_env: Annotated[Env, Field(min_length=1)]
    control_env: Annotated[Env, Field(min_length=1)]

    @field_validator("entry")
    @classmethod
    def _entry(cls, value: list[str]) -> list[str]:
        if value[0].startswith("-"):
            raise ValueError(f"expected a program as the first word, got {value[0]!r}")
        return value


class Metrics(Strict):
    diff_max: Metric = METRICS["diff_max"]
    diff_mean: Metric = METRICS["diff_mean"]
    k3_kl: Metric = METRICS["k3_kl"]
    reward: Metric = METRICS["reward"]
    loss: Metric = METRICS["loss"]
    weights_before: Metric = METRICS["weights_before"]
    weights_after: Metric = METRICS["weights_after"]
    throughput: Metric = METRICS["throughput"]


class Mount(Strict):
    """Always mounted read-only; there is no mode field on purpose."""
    source: AbsPath
    target: AbsPath


class Acceptance(Strict):
    steps: Annotated[int, BeforeValidator(_no_bool), Field(strict=True, ge=2)] = 2
    steps_key: OverrideKey = "trainer.total_training_steps"
    lr_key: OverrideKey = "actor_rollout_ref.actor.optim.lr"
    timeout_s: PosInt = 900
    gpus: Annotated[int, BeforeValidator(_no_bool), Field(strict=True, ge=0)] = 0
    mounts: list[Mount] = []
    metrics: Metrics = Metrics()
    required_gates: Annotated[list[GateName], AfterValidator(_unique)] = list(GATES)

    @field_validator("mounts")
    @classmethod
    def _targets(cls, value: list[Mount]) -> list[Mount]:
        _unique([m.target for m in value])
        return value


class Pins(Strict):
    schema_version: Annotated[Literal[1], BeforeValidator(_no_bool)]
    name: Name
    image: Image
    base: Base
    components: Components
    compat: list[Compat] = []
    build: Build
    recipe: Recipe
    acceptance: Acceptance = Acceptance()

    _path: Path = PrivateAttr(default=Path())
    _sha256: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _cross_checks(self) -> "Pins":
        key, overrides = self.acceptance.lr_key, self.recipe.overrides
        lr = overrides.get(key)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"recipe.overrides[{key}]: expected a learning rate > 0 (acceptance.lr_key),"
                             f" got {lr!r}")
        steps = overrides.get(self.acceptance.steps_key)
        if steps is not None and steps != self.acceptance.steps:
            raise ValueError(f"recipe.overrides[{self.acceptance.steps_key}]: expected {self.acceptance.steps}"
                             f" (acceptance.steps), got {steps!r}")
        if set(self.recipe.aligned_env) != set(self.recipe.control_env):
            raise ValueError("recipe.control_env: expected the same keys as recipe.aligned_env")
        if self.recipe.aligned_env == self.recipe.control_env:
            raise ValueError("recipe.control_env: expected at least one value that differs from aligned_env")
        both = set(self.recipe.env) & set(self.recipe.aligned_env)
        if both:
            raise ValueError(f"recipe.env: expected no key also set by aligned_env/control_env, got {sorted(both)}")
        return self

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

    def to_json_dict(self) -> dict:
        return self.model_dump(mode="json")


# ---- YAML: strict loading ----

class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1e-6 as a float (YAML 1.1 wants 1.0e-6), like Hydra does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _duplicates(node: yaml.Node, path: str = "") -> None:
    """Walk the composed tree; raise on the first mapping that repeats a key."""
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
            where = f"{path}.{key}" if path else str(key)
            if key in seen:
                raise BadInput(f"{where}: duplicate key (lines {seen[key]} and {key_node.start_mark.line + 1})")
            seen[key] = key_node.start_mark.line + 1
            _duplicates(value_node, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _duplicates(item, f"{path}[{i}]")


def read_yaml(text: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _duplicates(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _where(loc: tuple) -> str:
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


def _allowed_keys(loc: tuple) -> list[str]:
    """Field names of the model that holds the unknown key at `loc` (empty if not found)."""
    model: Any = Pins
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return []
        model = model.model_fields[part].annotation
        while get_origin(model) in (list, Annotated):
            model = get_args(model)[0]
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _one_line(exc: ValidationError) -> str:
    """First error as `<dotted.field>: <what was expected>`, plus a count of the others."""
    errors = exc.errors()
    err = errors[0]
    msg, kind, value = err["msg"], err["type"], err.get("input")
    if kind == "missing":
        text = "required field missing"
    elif kind == "extra_forbidden":
        allowed = _allowed_keys(err["loc"])
        text = "unknown key" + (f" (expected one of: {', '.join(allowed)})" if allowed else "")
    elif kind == "value_error":
        text = msg.removeprefix("Value error, ")
    else:
        text = msg.replace("Input should be", "expected").replace("a valid integer", "an integer")
        text = text.replace("a valid ", "a ")
        if kind == "string_type":
            text += " (quote it in YAML)"
        if isinstance(value, (str, int, float, bool)) or value is None:
            text += f", got {value!r}"
    where = _where(err["loc"])
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
        raise BadInput(f"{label}: {_one_line(exc)}") from None


def load(path: str | Path) -> Pins:
    label = str(path)
    try:
        raw = Path(path).read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise BadInput(f"{label}: cannot read the pins file: {reason}") from None
    try:
        data = read_yaml(text)
    except BadInput as exc:
        raise BadInput(f"{label}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise BadInput(f"{label}: {at}invalid YAML: {problem}") from None
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


if __name__ == "__main__":
    if sys.argv[1:] == ["--schema"]:
        sys.stdout.write(schema_json())
    elif len(sys.argv) == 2:
        try:
            print(json.dumps(load(sys.argv[1]).to_json_dict(), indent=2))
        except BadInput as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(exc.exit_code)
    else:
        print("usage: python -m builder.pins --schema | PINS_FILE", file=sys.stderr)
        sys.exit(2)
