"""Pins: every rejection is a BadInput (exit 2) whose one line names the file and the field."""
import copy
import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.core.constants import COMPONENTS
from builder.core.errors import BadInput
from builder.pins import model as pins

ROOT = Path(__file__).resolve().parents[2]
SHA = "a" * 40
DIGEST = "sha256:" + "b" * 64


def component(name: str, pr: int) -> dict[str, Any]:
    return {"url": f"demo-stack/{name}.git", "target": "main", "pr": pr,
            "commit": hashlib.sha1(name.encode()).hexdigest(),
            "distribution": name, "modules": [name],
            "install": {"pip_args": ["--no-deps", "--no-build-isolation"], "env": {}}}


GOOD: dict[str, Any] = {
    "schema_version": 1,
    "name": "demo-true-on-policy",
    "image": {"repository": "127.0.0.1:5000/demo/unified", "tags": ["demo"]},
    "base": {"image": f"127.0.0.1:5000/demo/base@{DIGEST}", "platform": "linux/amd64",
             "python": "3.11", "python_bin": "/opt/venv/bin/python"},
    "components": {"vllm": component("tinyengine", 11), "megatron": component("tinycore", 22),
                   "verl": component("tinyrl", 33)},
    "compat": [{"package": "tinyengine", "version": "0.1.0", "reason": "parameter naming of 0.x"}],
    "build": {"env": {"MAX_JOBS": "2"}, "lock": "locks/demo.lock", "constraints": ["torch"]},
    "recipe": {"entry": ["python", "-m", "tinyrl.main_ppo"],
               "overrides": {"trainer.total_training_steps": 2, "actor_rollout_ref.actor.optim.lr": 0.001,
                             "trainer.logger": ["console", "file"]},
               "env": {}, "aligned_env": {"DEMO_BATCH_INVARIANT": "1"},
               "control_env": {"DEMO_BATCH_INVARIANT": "0"}},
}


@pytest.fixture
def pins_dir() -> Iterator[Path]:
    """A short folder (not pytest's per-worker tmp_path): messages quote the file whole only while they fit 300 characters."""
    folder = Path(tempfile.mkdtemp(prefix="pins-"))
    (folder / "locks").mkdir()
    (folder / "locks" / "demo.lock").write_text("tinyx==1.0 --hash=sha256:" + "c" * 64 + "\n")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def write(directory: Path, data: str | dict[str, Any], name: str = "p.yaml") -> Path:
    path = directory / name
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    path.write_text(text)
    return path


def with_value(dotted: str, value: object, delete: bool = False) -> dict[str, Any]:
    """GOOD with one field (dotted path, list indices as numbers) set or deleted."""
    data = copy.deepcopy(GOOD)
    *parents, last = dotted.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if delete:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


def rejected(directory: Path, data: str | dict[str, Any], field: str, fragment: str = "") -> str:
    path = write(directory, data)
    with pytest.raises(BadInput) as info:
        pins.load(path)
    message = str(info.value)
    assert info.value.exit_code == 2
    assert "\n" not in message
    assert message.startswith(f"{path}: {field}"), message
    assert fragment in message, message
    return message


# ---- accepted input ----

def test_good_file_loads_with_path_hash_and_helpers(pins_dir: Path) -> None:
    path = write(pins_dir, GOOD)
    p = pins.load(path)
    assert p.path == path.resolve() and p.directory == pins_dir.resolve()
    assert p.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert p.rl_lr() == 0.001
    assert p.lock_path() == (pins_dir / "locks" / "demo.lock").resolve()
    assert p.component_url("verl") == str(pins_dir.resolve() / "demo-stack" / "tinyrl.git")
    assert [name for name, _ in p.components.items()] == ["vllm", "megatron", "verl"]
    dumped = p.to_json_dict()
    assert dumped["components"]["vllm"]["pr"] == 11 and "path" not in dumped and "sha256" not in dumped
    assert dumped["acceptance"]["metrics"]["diff_max"] == "training/rollout_probs_diff_max"
    assert dumped["acceptance"]["required_gates"] == ["provenance", "zero_update", "rl_step", "control"]


def test_tag_with_digest_is_accepted_and_recorded(pins_dir: Path) -> None:
    image = f"nvcr.io/nvidia/pytorch:26.07-py3@{DIGEST}"
    p = pins.load(write(pins_dir, with_value("base.image", image)))
    assert (p.base.name, p.base.tag, p.base.digest) == ("nvcr.io/nvidia/pytorch", "26.07-py3", DIGEST)
    p = pins.load(write(pins_dir, with_value("base.image", f"127.0.0.1:5000/demo/base:v1@{DIGEST}")))
    assert (p.base.name, p.base.tag) == ("127.0.0.1:5000/demo/base", "v1")
    p = pins.load(write(pins_dir, GOOD))
    assert (p.base.name, p.base.tag) == ("127.0.0.1:5000/demo/base", None)


def test_remote_urls_are_kept_and_file_urls_allowed(pins_dir: Path) -> None:
    for url in ["https://github.com/vllm-project/vllm.git", "ssh://git@github.com/NVIDIA/Megatron-LM.git",
                "git@github.com:verl-project/verl.git", "file:///srv/mirrors/vllm.git", "/srv/mirrors/vllm.git"]:
        p = pins.load(write(pins_dir, with_value("components.vllm.url", url)))
        assert p.component_url("vllm") == url


def test_yaml_exponent_without_dot_is_a_float(pins_dir: Path) -> None:
    text = yaml.safe_dump(GOOD, sort_keys=False).replace("optim.lr: 0.001", "optim.lr: 1e-6")
    assert pins.load(write(pins_dir, text)).rl_lr() == 1e-6


def test_recipe_command_formats_hydra_overrides(pins_dir: Path) -> None:
    """The argv the suite runs in the image (acceptance.recipe.command) from the pins' gate settings."""
    from acceptance import recipe
    from builder.gating.settings import GateSettings

    p = pins.load(write(pins_dir, GOOD))
    settings = dict(GateSettings.of(p).wire("rl_step"), overrides={**p.recipe.overrides, "+x.flag": True})
    argv, env = recipe.command(settings, 0.0, "/tmp/m.jsonl")
    assert argv[:3] == ["python", "-m", "tinyrl.main_ppo"]
    assert "trainer.total_training_steps=2" in argv and "trainer.logger=[console,file]" in argv
    assert "+x.flag=true" in argv and "actor_rollout_ref.actor.optim.lr=0.0" in argv
    assert env == {"VERL_FILE_LOGGER_PATH": "/tmp/m.jsonl"}


def test_symlinked_lock_inside_the_directory_is_accepted(pins_dir: Path) -> None:
    (pins_dir / "locks" / "link.lock").symlink_to(pins_dir / "locks" / "demo.lock")
    p = pins.load(write(pins_dir, with_value("build.lock", "locks/link.lock")))
    assert p.lock_path() == (pins_dir / "locks" / "demo.lock").resolve()


# ---- structure ----

@pytest.mark.parametrize("dotted", ["extra", "image.digest", "components.vllm.install.script",
                                    "acceptance.metrics.other", "build.cache"])
def test_unknown_keys(pins_dir: Path, dotted: str) -> None:
    rejected(pins_dir, with_value(dotted, "x"), dotted, "unknown key")


def test_unknown_key_in_a_mount(pins_dir: Path) -> None:
    data = with_value("acceptance.mounts", [{"source": "/a", "target": "/b", "mode": "rw"}])
    rejected(pins_dir, data, "acceptance.mounts[0].mode", "unknown key (expected one of: source, target)")


@pytest.mark.parametrize("text,field", [
    ("name: a\nname: b\n", "name"),
    ("image:\n  repository: x\n  tags: []\n  repository: y\n", "image.repository"),
])
def test_duplicate_keys(pins_dir: Path, text: str, field: str) -> None:
    rejected(pins_dir, text, field, "duplicate key")


def test_missing_component(pins_dir: Path) -> None:
    rejected(pins_dir, with_value("components.verl", None, delete=True), "components.verl", "required")


def test_extra_component(pins_dir: Path) -> None:
    rejected(pins_dir, with_value("components.sglang", component("x", 1)), "components.sglang",
             "unknown key (expected one of: vllm, megatron, verl)")


@pytest.mark.parametrize("field", ["target", "pr", "commit", "distribution", "modules", "url"])
def test_missing_component_fields(pins_dir: Path, field: str) -> None:
    rejected(pins_dir, with_value(f"components.vllm.{field}", None, delete=True),
             f"components.vllm.{field}", "required")


@pytest.mark.parametrize("section", ["base", "build", "recipe", "image", "components"])
def test_missing_sections(pins_dir: Path, section: str) -> None:
    rejected(pins_dir, with_value(section, None, delete=True), section, "required")


@pytest.mark.parametrize("value", [2, True, "1"])
def test_schema_version_must_be_1(pins_dir: Path, value: bool | int | str) -> None:
    rejected(pins_dir, with_value("schema_version", value), "schema_version")


# ---- base image, commits, PRs ----

@pytest.mark.parametrize("image", [
    "latest", "nvcr.io/nvidia/pytorch:26.07-py3", "ubuntu:latest", "127.0.0.1:5000/demo/base",
    "127.0.0.1:5000/demo/base@sha256:" + "b" * 63, "127.0.0.1:5000/demo/base@sha256:" + "B" * 64,
    "127.0.0.1:5000/demo/base@sha512:" + "b" * 64,
])
def test_base_image_needs_a_digest(pins_dir: Path, image: str) -> None:
    rejected(pins_dir, with_value("base.image", image), "base.image", "sha256:<64 lowercase hex>")


def test_short_commit_message_is_exact(pins_dir: Path) -> None:
    message = rejected(pins_dir, with_value("components.vllm.commit", "abc123"), "components.vllm.commit")
    assert message.endswith("components.vllm.commit: expected a full 40-hex commit SHA, got 'abc123'")


@pytest.mark.parametrize("commit", ["g" * 40, "A" * 40, "a" * 41, "a" * 39, 1234567])
def test_bad_commits(pins_dir: Path, commit: int | str) -> None:
    rejected(pins_dir, with_value("components.megatron.commit", commit), "components.megatron.commit",
             "40-hex commit SHA")


@pytest.mark.parametrize("pr", [0, -3, "11", True, 1.5])
def test_bad_pr_numbers(pins_dir: Path, pr: bool | float | int | str) -> None:
    rejected(pins_dir, with_value("components.verl.pr", pr), "components.verl.pr")


@pytest.mark.parametrize("target", ["", "-main", "a..b", "main/", "x.lock", "main branch", "ma$in"])
def test_bad_targets(pins_dir: Path, target: str) -> None:
    rejected(pins_dir, with_value("components.vllm.target", target), "components.vllm.target")


@pytest.mark.parametrize("field,value", [
    ("base.platform", "linux/riscv64"), ("base.python", 3.11), ("base.python", "python3"),
    ("base.python_bin", "python"), ("base.python_bin", "/opt/venv/bin/py thon"),
    ("name", "Demo"), ("image.tags", ["demo", "demo"]), ("build.constraints", ["torch", "torch"]),
    ("components.vllm.modules", []), ("acceptance.required_gates", ["provenance", "smoke"]),
    ("acceptance.steps", 1), ("acceptance.gpus", -1), ("acceptance.timeout_s", 0),
    ("acceptance.mounts", [{"source": "models", "target": "/m"}]),
    ("acceptance.mounts", [{"source": "/a", "target": "/m"}, {"source": "/b", "target": "/m"}]),
    ("compat.0.reason", ""), ("compat.0.version", 0.6),
])
def test_bad_scalar_fields(pins_dir: Path, field: str,
                           value: float | int | list[Any] | list[dict[str, Any]] | list[str] | str) -> None:
    path = ".".join(f"[{p}]" if p.isdigit() else p for p in field.split(".")).replace(".[", "[")
    rejected(pins_dir, with_value(field, value), path)


@pytest.mark.parametrize("value", ["/..", "/", "/opt/venv/bin/", "/opt/./python", "//opt/python",
                                   "/opt/venv/../bin/python", "/opt/venv/bin/.", "/opt//python"])
def test_python_bin_must_be_a_normalised_absolute_file_path(pins_dir: Path, value: str) -> None:
    message = rejected(pins_dir, with_value("base.python_bin", value), "base.python_bin",
                       "expected an absolute normalised path to a file")
    assert len(message) <= 300 and repr(value) in message


@pytest.mark.parametrize("value", ["/usr/bin/python3", "/opt/venv/bin/python3.11", "/opt/.venv/bin/python",
                                   "/x/...", "/opt/venv/bin/..python"])
def test_python_bin_file_paths_accepted(pins_dir: Path, value: str) -> None:
    assert pins.load(write(pins_dir, with_value("base.python_bin", value))).base.python_bin == value


def test_compat_reason_is_required(pins_dir: Path) -> None:
    rejected(pins_dir, with_value("compat.0.reason", None, delete=True), "compat[0].reason", "required")


# ---- injection into Dockerfile / shell ----

INJECTIONS = ["x\ny", "x\rRUN id", "$(id)", 'a"b', "a;b", "`id`", "a|b", "a&b", "a>b", "a\\b", "${HOME}"]
TARGETS = [
    ("image.repository", "image.repository"),
    ("image.tags", "image.tags[0]"),
    ("base.image", "base.image"),
    ("base.python_bin", "base.python_bin"),
    ("build.env.MAX_JOBS", "build.env.MAX_JOBS"),
    ("components.vllm.install.env.FOO", "components.vllm.install.env.FOO"),
    ("components.vllm.install.pip_args", "components.vllm.install.pip_args[0]"),
    ("components.vllm.modules", "components.vllm.modules[0]"),
    ("components.vllm.distribution", "components.vllm.distribution"),
    ("components.vllm.url", "components.vllm.url"),
    ("recipe.entry", "recipe.entry[0]"),
    ("recipe.env.VERL_FILE_LOGGER_PATH", "recipe.env.VERL_FILE_LOGGER_PATH"),
    ("recipe.overrides.seed", "recipe.overrides.seed"),
    ("build.constraints", "build.constraints[0]"),
    ("compat.0.reason", "compat[0].reason"),
    ("acceptance.metrics.diff_max", "acceptance.metrics.diff_max"),
]


@pytest.mark.parametrize("value", INJECTIONS)
@pytest.mark.parametrize("dotted,field", TARGETS)
def test_injection_is_refused(pins_dir: Path, dotted: str, field: str, value: str) -> None:
    list_field = field.endswith("[0]")
    rejected(pins_dir, with_value(dotted, [value] if list_field else value), field, "expected")


@pytest.mark.parametrize("dotted,field", [
    ("image.repository", "image.repository"), ("components.vllm.distribution", "components.vllm.distribution"),
    ("components.vllm.modules", "components.vllm.modules[0]"),
    ("build.env.MAX_JOBS", "build.env.MAX_JOBS"), ("recipe.entry", "recipe.entry"),
])
def test_leading_dash_is_refused_outside_options(pins_dir: Path, dotted: str, field: str) -> None:
    list_field = field.endswith("[0]") or field == "recipe.entry"
    rejected(pins_dir, with_value(dotted, ["-rf"] if list_field else "-rf"), field)


@pytest.mark.parametrize("value", [" 9.0", "9.0 ", "9.0  10.0"])
def test_env_value_spaces_only_single_and_inner(pins_dir: Path, value: str) -> None:
    rejected(pins_dir, with_value("build.env.TORCH_CUDA_ARCH_LIST", value), "build.env.TORCH_CUDA_ARCH_LIST")


def test_env_value_with_inner_space_is_accepted(pins_dir: Path) -> None:
    p = pins.load(write(pins_dir, with_value("build.env.TORCH_CUDA_ARCH_LIST", "9.0 10.0+PTX")))
    assert p.build.env["TORCH_CUDA_ARCH_LIST"] == "9.0 10.0+PTX"


@pytest.mark.parametrize("key", ["max_jobs", "1X", "A-B", "A B", "A$"])
def test_env_names(pins_dir: Path, key: str) -> None:
    rejected(pins_dir, with_value(f"build.env.{key}", "1"), f"build.env.{key}", "env var name")


@pytest.mark.parametrize("arg", ["--index-url=https://evil/simple", "--extra-index-url=x", "-e", "--target=/x",
                                 "--no deps", "no-deps", "--opt=a;b", "--OPT"])
def test_pip_args(pins_dir: Path, arg: str) -> None:
    rejected(pins_dir, with_value("components.megatron.install.pip_args", [arg]),
             "components.megatron.install.pip_args[0]", "pip option")


def test_ignore_requires_python_is_allowed(pins_dir: Path) -> None:
    args = ["--no-build-isolation", "--no-deps", "--ignore-requires-python"]  # megatron-core on a 3.11 base
    p = pins.load(write(pins_dir, with_value("components.megatron.install.pip_args", args)))
    assert p.components["megatron"].install.pip_args == args


@pytest.mark.parametrize("url", ["ssh://-oProxyCommand=id/x", "ext::sh -c id", "-u/x", "git@-x:y",
                                 "ftp://host/x.git", "file://relative", "https://host/a b"])
def test_bad_urls(pins_dir: Path, url: str) -> None:
    rejected(pins_dir, with_value("components.vllm.url", url), "components.vllm.url")


def test_relative_url_must_stay_inside(pins_dir: Path) -> None:
    rejected(pins_dir, with_value("components.vllm.url", "../other/repo.git"), "components.vllm.url",
             "inside")


@pytest.mark.parametrize("key", ["a b", "a..b", "1a", "a;b", "++a", "a.", "-a"])
def test_override_keys(pins_dir: Path, key: str) -> None:
    rejected(pins_dir, with_value("recipe.overrides", {**GOOD["recipe"]["overrides"], key: 1}),
             "recipe.overrides", "override key")


@pytest.mark.parametrize("value", [{"a": 1}, [[1]], None, ["ok", "a b"]])
def test_override_values(pins_dir: Path, value: dict[str, Any] | list[list[int]] | list[str] | None) -> None:
    rejected(pins_dir, with_value("recipe.overrides.seed", value), "recipe.overrides.seed", "scalar")


# ---- lock path ----

@pytest.mark.parametrize("lock,fragment", [
    ("../x.lock", "inside"), ("locks/../../x.lock", "inside"), ("/etc/passwd", "relative"),
    ("locks/missing.lock", "existing lock file"), ("locks", "existing lock file"),
])
def test_lock_path(pins_dir: Path, lock: str, fragment: str) -> None:
    (pins_dir.parent / "x.lock").write_text("")
    rejected(pins_dir, with_value("build.lock", lock), "build.lock", fragment)


def test_lock_symlink_to_outside(pins_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside") / "evil.lock"
    outside.write_text("")
    (pins_dir / "locks" / "evil.lock").symlink_to(outside)
    rejected(pins_dir, with_value("build.lock", "locks/evil.lock"), "build.lock", "inside")


# ---- cross-field checks ----

@pytest.mark.parametrize("lr", [0, -0.1, "0.001", True])
def test_learning_rate_must_be_positive_number(pins_dir: Path, lr: bool | float | int | str) -> None:
    data = copy.deepcopy(GOOD)
    data["recipe"]["overrides"]["actor_rollout_ref.actor.optim.lr"] = lr
    rejected(pins_dir, data,
             "recipe.overrides[actor_rollout_ref.actor.optim.lr]", "learning rate")


def test_learning_rate_must_be_present(pins_dir: Path) -> None:
    data = copy.deepcopy(GOOD)
    del data["recipe"]["overrides"]["actor_rollout_ref.actor.optim.lr"]
    rejected(pins_dir, data, "recipe.overrides[actor_rollout_ref.actor.optim.lr]", "got None")


def test_steps_override_must_match_acceptance_steps(pins_dir: Path) -> None:
    data = with_value("acceptance.steps", 3)
    rejected(pins_dir, data, "recipe.overrides[trainer.total_training_steps]", "expected 3")


@pytest.mark.parametrize("control", [{"DEMO_BATCH_INVARIANT": "1"}, {"OTHER": "0"}, {}])
def test_control_env_must_differ_from_aligned(pins_dir: Path, control: dict[str, Any]) -> None:
    rejected(pins_dir, with_value("recipe.control_env", control), "recipe.control_env")


def test_common_env_must_not_shadow_the_switch(pins_dir: Path) -> None:
    rejected(pins_dir, with_value("recipe.env", {"DEMO_BATCH_INVARIANT": "1"}), "recipe.env", "aligned_env")


# ---- the file itself ----

@pytest.mark.parametrize("text,kind", [("- a\n- b\n", "list"), ("just a string\n", "str"), ("", "NoneType"),
                                       ("42\n", "int")])
def test_yaml_must_be_a_mapping(pins_dir: Path, text: str, kind: str) -> None:
    path = write(pins_dir, text)
    with pytest.raises(BadInput, match=f"^{path}: expected a YAML mapping at the top level, got {kind}$"):
        pins.load(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(BadInput, match=f"^{path}: cannot read the pins file") as info:
        pins.load(path)
    assert info.value.exit_code == 2


def test_bad_yaml_syntax(pins_dir: Path) -> None:
    path = write(pins_dir, "name: [a, b\nimage: {\n")
    with pytest.raises(BadInput, match=f"^{path}: line [0-9]+: invalid YAML") as info:
        pins.load(path)
    assert "\n" not in str(info.value)


def test_file_not_utf8(pins_dir: Path) -> None:
    path = pins_dir / "p.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(BadInput, match=f"^{path}: cannot read the pins file"):
        pins.load(path)


def test_several_errors_are_counted_on_one_line(pins_dir: Path) -> None:
    data = with_value("name", "Bad")
    data["base"]["platform"] = "x"
    message = rejected(pins_dir, data, "name")
    assert message.endswith("(and 1 more)")


def test_cli_exits_2_on_bad_file(pins_dir: Path) -> None:
    path = write(pins_dir, with_value("components.vllm.commit", "abc123"))
    run = subprocess.run([sys.executable, "-m", "builder", "pins", str(path)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip() == f"error: {path}: components.vllm.commit: expected a full 40-hex commit SHA, got 'abc123'"


# ---- shipped files ----

def test_nemotron_pins_validate() -> None:
    p = pins.load(ROOT / "pins" / "nemotron-3.5-lightning.yaml")
    assert (p.components.vllm.pr, p.components.megatron.pr, p.components.verl.pr) == (54955, 7050, 7688)
    assert p.components.vllm.commit == "4b5c627c23e6690b8987100d1cbf78e34ac14bf9"
    assert p.components.megatron.target == "dev" and p.components.megatron.distribution == "megatron-core"
    assert p.base.tag == "26.07-py3" and p.base.python == "3.12"
    assert p.compat[0].package == "megatron-bridge" and p.compat[0].version == "0.6.2"
    assert p.rl_lr() == 1e-6 and p.acceptance.gpus == 8
    assert p.recipe.aligned_env == {"VLLM_BATCH_INVARIANT": "1"}


def test_nemotron_lock_has_hashes_for_every_requirement() -> None:
    lines = (ROOT / "pins" / "locks" / "nemotron.lock").read_text().replace("\\\n", " ").splitlines()
    reqs = [line for line in lines if line.strip() and not line.startswith("#")]
    assert reqs and all("==" in r and "--hash=sha256:" in r for r in reqs)
    assert any(r.startswith("megatron-bridge==0.6.2 ") for r in reqs)


def test_demo_pins_validate_in_place() -> None:
    p = pins.load(ROOT / "pins" / "demo.yaml")
    assert p.build.lock == "locks/demo.lock"
    assert p.image.repository == "127.0.0.1:5000/demo/unified" and p.base.python_bin == "/opt/venv/bin/python"
    assert [p.components[n].distribution for n in COMPONENTS] == ["tinyengine", "tinycore", "tinyrl"]
    assert p.rl_lr() == 0.001 and p.acceptance.timeout_s == 600
    assert p.acceptance.metrics.throughput == "perf/rollout_tokens_per_s"


@pytest.mark.parametrize("name", ["demo.yaml", "nemotron-3.5-lightning.yaml"])
def test_pins_files_point_at_the_schema(name: str) -> None:
    first = (ROOT / "pins" / name).read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../builder/pins/schema/pins.schema.json"


def test_committed_schema_is_up_to_date() -> None:
    committed = (ROOT / "builder" / "pins" / "schema" / "pins.schema.json").read_text()
    assert committed == pins.schema_json(), "run: builder pins --schema > builder/pins/schema/pins.schema.json"


def test_schema_refuses_unknown_keys() -> None:
    schema = yaml.safe_load(pins.schema_json())
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["Component"]["additionalProperties"] is False
    assert set(schema["$defs"]["Components"]["required"]) == {"vllm", "megatron", "verl"}


# ---- acceptance.weights / acceptance.checkpoint (weight evidence)

CKPT = {"overrides": {"trainer.save_freq": 1, "actor_rollout_ref.actor.checkpoint.save_contents": ["hf_model"]}}


def _weights(mode: str, checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    data = with_value("acceptance.weights", mode)
    if checkpoint is not None:
        data["acceptance"]["checkpoint"] = checkpoint
    return data


def test_checkpoint_mode_defaults_to_verl_names_and_the_tmpfs(pins_dir: Path) -> None:
    loaded = pins.load(write(pins_dir, _weights("checkpoint", CKPT)))
    ckpt = loaded.acceptance.checkpoint
    assert ckpt is not None
    assert loaded.acceptance.weights == "checkpoint" and ckpt.dir_key == "trainer.default_local_dir"
    assert ckpt.dir.startswith("/tmp/") and ckpt.scratch is None and "{step}" in ckpt.layout
    assert pins.load(write(pins_dir, GOOD)).acceptance.weights == "metrics"


@pytest.mark.parametrize("mode,checkpoint,field,fragment", [
    ("checkpoint", None, "acceptance", "expected the recipe's checkpoint options"),
    ("sometimes", None, "acceptance.weights", "metrics"),
    ("checkpoint", {**CKPT, "layout": "global_step/actor"}, "acceptance.checkpoint.layout", "{step}"),
    ("checkpoint", {**CKPT, "dir": "/ckpt"}, "acceptance.checkpoint", "under the /tmp tmpfs"),
    ("checkpoint", {**CKPT, "dir": "/tmp/c", "scratch": "/scratch"}, "acceptance.checkpoint", "outside the tmpfs"),
    ("checkpoint", {"overrides": {"trainer.default_local_dir": "/x"}}, "acceptance.checkpoint", "dir_key"),
    ("checkpoint", {"overrides": {}}, "acceptance.checkpoint.overrides", ""),
    ("checkpoint", {**CKPT, "may_stay": ["a b"]}, "acceptance.checkpoint.may_stay[0]", "glob"),
])
def test_bad_checkpoint_settings_are_refused(pins_dir: Path, mode: str, checkpoint: dict[str, Any] | None, field: str,
                                             fragment: str) -> None:
    rejected(pins_dir, _weights(mode, checkpoint), field, fragment)


# ---- issue 28: CUDA archs the toolchains know, strict numbers, the field that is wrong ----

VLLM_CUDA = {"device": "cuda", "device_var": "VLLM_TARGET_DEVICE", "cuda_arch": ["9.0"]}


@pytest.mark.parametrize("arch", ["99.9", "9.9", "8.1", "9.0f", "8.9a", "13.0", "4.0+PTX"])
def test_an_impossible_cuda_arch_is_refused_naming_the_field(pins_dir: Path, arch: str) -> None:
    native = {**VLLM_CUDA, "cuda_arch": ["9.0", arch]}
    message = rejected(pins_dir, with_value("components.vllm.native", native), "components.vllm.native.cuda_arch[1]: ",
                       f"expected a CUDA arch nvcc 12.x/13.x knows, got '{arch}': 5.0 5.2 ")
    assert message.endswith(" 12.1; a/f: 10.0 up (a: 9.0 too); +PTX"), message


@pytest.mark.parametrize("arch", ["5.0", "7.5", "8.8", "9.0a", "10.0a", "10.0f", "10.3f", "11.0", "12.1f",
                                  "8.0+PTX", "12.0a+PTX"])
def test_cuda_archs_the_toolchains_know_are_accepted(pins_dir: Path, arch: str) -> None:
    p = pins.load(write(pins_dir, with_value("components.vllm.native", {**VLLM_CUDA, "cuda_arch": [arch]})))
    assert p.components["vllm"].build_env()["TORCH_CUDA_ARCH_LIST"] == arch


def test_the_arch_table_holds_what_this_machines_nvcc_lists() -> None:
    """`nvcc --list-gpu-arch` (compute_XY) of the CUDA toolchain here, when there is one: each is in the table."""
    import shutil

    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("no nvcc on this machine")
    listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout.split()
    archs = [f"{int(a[8:]) // 10}.{int(a[8:]) % 10}" for a in listed if a.startswith("compute_") and a[8:].isdigit()]
    assert archs and [a for a in archs if a not in pins.CUDA_ARCH_KNOWN] == []


@pytest.mark.parametrize(("field", "value"), [
    ("acceptance.performance.min_ratio", "0.001"), ("acceptance.performance.max_spread", "1.5"),
    ("nightly.regression_threshold", "0.05"), ("acceptance.performance.min_ratio", True),
    ("acceptance.performance.max_spread", float("inf")), ("nightly.regression_threshold", float("nan")),
])
def test_every_float_field_refuses_a_quoted_or_non_number(pins_dir: Path, field: str, value: object) -> None:
    data = copy.deepcopy(GOOD)
    data["acceptance"] = {"performance": {"min_ratio": 0.5, "reason": "measured"}}
    *parent, last = field.split(".")
    node: Any = data
    for part in parent:
        node = node.setdefault(part, {})
    node[last] = value
    message = rejected(pins_dir, data, f"{field}: ", "expected a")
    assert "expected a number" in message or "expected a finite number" in message, message


def test_float_fields_take_integers_and_floats(pins_dir: Path) -> None:
    data = copy.deepcopy(GOOD)
    data["acceptance"] = {"performance": {"min_ratio": 1, "max_spread": 2, "reason": "measured"}}
    data["nightly"] = {"regression_threshold": 0}
    p = pins.load(write(pins_dir, data))
    assert p.acceptance.performance is not None and p.acceptance.performance.min_ratio == 1
    assert p.nightly.regression_threshold == 0


@pytest.mark.parametrize(("native", "field", "fragment"), [
    ({"device_var": "VLLM_TARGET_DEVICE"}, "components.vllm.native.device: ", "required with device_var"),
    ({"device": "cpu"}, "components.vllm.native.device_var: ", "required with device"),
    ({**VLLM_CUDA, "cuda_arch": []}, "components.vllm.native.cuda_arch: ", "expected the arch list"),
    ({"max_jobs": 8, "device": "cpu", "device_var": "X_DEVICE"}, "components.vllm.install.env: ", "MAX_JOBS"),
])
def test_a_model_check_names_the_field_by_its_dotted_path(pins_dir: Path, native: dict[str, Any], field: str,
                                                          fragment: str) -> None:
    data = with_value("components.vllm.native", native)
    if "max_jobs" in native:
        data["components"]["vllm"]["install"]["env"] = {"MAX_JOBS": "2"}
    rejected(pins_dir, data, field, fragment)


def test_the_cli_refuses_a_missing_device_in_one_line_exit_2(pins_dir: Path) -> None:
    path = write(pins_dir, with_value("components.vllm.native", {"device_var": "VLLM_TARGET_DEVICE"}))
    before = sorted(p.name for p in pins_dir.iterdir())
    run = subprocess.run([sys.executable, "-m", "builder", "render", "--pins-only", str(path)], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == ""
    errors = [line for line in run.stderr.splitlines() if not line.startswith(("==> ", "<== "))]  # step lines
    assert errors == [f"error: {path}: components.vllm.native.device: required with device_var"
                      " (VLLM_TARGET_DEVICE carries it): the target device, like 'cpu' or 'cuda'"]
    assert sorted(p.name for p in pins_dir.iterdir()) == before
