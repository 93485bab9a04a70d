"""A generated corpus of hostile and broken inputs (issue 15), shared by tests/unit/test_hostile_corpus.py
and benchmarks/bench_corpus.py.

Each Case writes its files into an empty folder and names the command line to run on them. Refusals
expect exit 2 and one `error:` line naming the file and the field; legitimate values (`accept=True`, the
reason in the id) expect exit 0 with the value reaching the Dockerfile only inside a JSON string.
"""
from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import traceback
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEMO_TEXT = (ROOT / "pins" / "demo.yaml").read_text()
DEMO = yaml.safe_load(DEMO_TEXT)
LOCK = (ROOT / "pins" / "locks" / "demo.lock").read_bytes()


@dataclass
class Case:
    klass: str
    name: str
    setup: Callable[[Path], list[str]]       # writes files into the folder; returns argv
    field: str | None                        # expected in the error line (None: the file alone)
    accept: bool = False
    value: str | None = None                 # accepted value that must appear only JSON-quoted
    fragment: str = ""                       # also expected in the error line

    @property
    def id(self) -> str:
        return f"{self.klass}-{self.name}"


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    crashed: str = ""                        # a traceback, if any
    registry_calls: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- pins files

def _write_pins(folder: Path, text: str, name: str = "p.yaml") -> Path:
    (folder / "locks").mkdir(exist_ok=True)
    (folder / "locks" / "demo.lock").write_bytes(LOCK)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def refuse_cmd(path: Path) -> list[str]:
    return ["resolve", "--offline", str(path)]


def accept_cmd(path: Path) -> list[str]:
    return ["render", "--pins-only", str(path)]


def data_case(klass: str, name: str, field_: str | None, edits: dict[str, Any] | Callable[[dict[str, Any]], None],
              accept: bool = False, value: str | None = None, fragment: str = "") -> Case:
    """demo.yaml with fields set (dotted paths) or changed by a function, dumped as YAML."""

    def setup(folder: Path) -> list[str]:
        data = copy.deepcopy(DEMO)
        if callable(edits):
            edits(data)
        else:
            for dotted, v in edits.items():
                _set(data, dotted, v)
        path = _write_pins(folder, yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=10**9))
        return accept_cmd(path) if accept else refuse_cmd(path)

    return Case(klass, name, setup, field_, accept, value, fragment)


def text_case(klass: str, name: str, field_: str | None, edit: Callable[[str], str], fragment: str = "",
              accept: bool = False) -> Case:
    """demo.yaml as written, with its text edited (characters YAML would fold, comments, syntax)."""

    def setup(folder: Path) -> list[str]:
        path = _write_pins(folder, edit(DEMO_TEXT))
        return accept_cmd(path) if accept else refuse_cmd(path)

    return Case(klass, name, setup, field_, accept, None, fragment)


def _append(text: str, extra: str) -> str:
    return text + extra


def _constant(text: str, value: str) -> str:
    return value


def replace(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)

    return edit


# ---------------------------------------------------------------- 1. parser limits

def _bomb(levels: int, width: int) -> str:
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def parser_cases() -> list[Case]:
    cases = []
    for levels, width in ((5, 9), (6, 9), (9, 9), (12, 4), (20, 2), (5, 30)):
        cases.append(text_case("parser", f"alias-bomb-{levels}x{width}", None, partial(_append, extra=_bomb(levels, width)),
                               fragment="alias"))
    for depth in (33, 100, 500, 999, 10_000):
        cases.append(text_case("parser", f"nested-lists-{depth}", None,
                               partial(_append, extra="extra: " + "[" * depth + "]" * depth + "\n"), fragment="nest"))
        cases.append(text_case("parser", f"nested-maps-{depth}", None,
                               partial(_append, extra="extra: " + "{a: " * depth + "1" + "}" * depth + "\n"), fragment="nest"))
    cases.append(text_case("parser", "nested-block-40", None,
                           lambda t: t + "".join(f"{'  ' * i}k{i}:\n" for i in range(40)) + "  " * 40 + "v: 1\n",
                           fragment="nested"))
    cases.append(text_case("parser", "value-3000-chars", "name", replace("name: demo-true-on-policy", "name: " + "a" * 3000),
                           fragment="3000 characters"))
    cases.append(text_case("parser", "key-3000-chars", "build.env", replace("MAX_JOBS:", "K" * 3000 + ":"),
                           fragment="3000 characters"))
    for size in (70_000, 1_000_000, 20_000_000):
        cases.append(text_case("parser", f"file-{size}-bytes-value", None,
                               replace("name: demo-true-on-policy", "name: " + "a" * size), fragment="bytes"))
    cases.append(text_case("parser", "file-of-comments-70k", None, lambda t: t + ("# " + "c" * 78 + "\n") * 900,
                           fragment="bytes"))
    cases.append(text_case("parser", "2600-keys", "recipe.overrides",
                           replace("    seed: 1\n", "    seed: 1\n" + "".join(f"    k{i}: 1\n" for i in range(2600))),
                           fragment="more than"))
    dups = {
        "top": ("schema_version: 1\n", "schema_version: 1\nschema_version: 1\n", "schema_version"),
        "name": ("name: demo-true-on-policy\n", "name: demo-true-on-policy\nname: x\n", "name"),
        "env": ('    MAX_JOBS: "2"\n', '    MAX_JOBS: "2"\n    MAX_JOBS: "3"\n', "build.env.MAX_JOBS"),
        "component": ("  megatron:\n", "  vllm: {}\n  megatron:\n", "components.vllm"),
        "override": ("    seed: 1\n", "    seed: 1\n    seed: 2\n", "recipe.overrides.seed"),
        "metrics": ("    throughput: perf/rollout_tokens_per_s\n",
                    "    throughput: perf/rollout_tokens_per_s\n    throughput: x\n", "acceptance.metrics.throughput"),
        "flow": ("  tags: [demo]\n", "  tags: [demo]\n  tags: [x]\n", "image.tags"),
        "quoted": ("schema_version: 1\n", "schema_version: 1\n\"schema_version\": 1\n", "schema_version"),
    }
    for key, (old, new, where) in dups.items():
        cases.append(text_case("parser", f"duplicate-{key}", where, replace(old, new), fragment="duplicate"))
    cases.append(text_case("parser", "merge-key", "recipe", replace("  aligned_env:\n", "  <<: {seed: 2}\n  aligned_env:\n"),
                           fragment="merge"))
    for tag in ("!!binary aGk=", "!!python/object/apply:os.system [id]", "!!set {a}", "!custom x",
                "!!timestamp 2001-12-14", "!!omap [{a: 1}]"):
        cases.append(text_case("parser", f"tag-{tag.split()[0].strip('!').replace('/', '_')}", "name",
                               replace("name: demo-true-on-policy", f"name: {tag}"), fragment="tag"))
    cases.append(text_case("parser", "alias-key", "(top level)", lambda t: t + "x: &k a\n*k : 1\n", fragment="plain string key"))
    cases.append(text_case("parser", "list-key", "(top level)", lambda t: t + "? [a]\n: 1\n", fragment="plain string key"))
    cases.append(text_case("parser", "two-documents", None, lambda t: t + "---\nname: x\n", fragment="document"))
    for name, text in (("top-list", "- a\n- b\n"), ("top-scalar", "hello\n"), ("empty", ""), ("top-null", "~\n")):
        cases.append(text_case("parser", name, None, partial(_constant, value=text), fragment="mapping"))
    for name, edit in (("tab-indent", replace("  repository:", "\trepository:")),
                       ("unclosed-flow", replace("tags: [demo]", "tags: [demo")),
                       ("bad-indent", replace("  platform: linux/amd64", "   platform: linux/amd64")),
                       ("unclosed-quote", replace('python: "3.11"', 'python: "3.11'))):
        cases.append(text_case("parser", name, None, edit, fragment="YAML"))
    cases.append(text_case("parser", "huge-int", "acceptance.timeout_s", replace("timeout_s: 600", "timeout_s: " + "9" * 2000)))
    cases.append(text_case("parser", "alias-fine-accepted", None,
                           replace("  constraints: [torch]\n", "  constraints: &c [torch]\n"), accept=True))
    return cases


# ---------------------------------------------------------------- 2. reference grammar

BAD_REPOSITORIES = {
    "double-dot": "127.0.0.1:5000/x..y", "dot-underscore": "127.0.0.1:5000/x._y", "trailing-dot": "127.0.0.1:5000/x.",
    "leading-sep": "127.0.0.1:5000/-x", "triple-underscore": "127.0.0.1:5000/a___b", "upper-path": "127.0.0.1:5000/Demo",
    "label-dash-end": "reg-.example.com/x", "label-dash-start": "-reg.example.com/x", "empty-label": "reg..com/x",
    "port-99999": "127.0.0.1:99999/x", "port-0": "127.0.0.1:0/x", "port-letters": "host.com:50a/x",
    "port-empty": "host.com:/x", "no-host": "demo/unified", "bare-name": "unified", "with-tag": "127.0.0.1:5000/x:tag",
    "with-digest": "127.0.0.1:5000/x@sha256:" + "a" * 64, "trailing-slash": "127.0.0.1:5000/x/",
    "double-slash": "127.0.0.1:5000//x", "space": "127.0.0.1:5000/x y", "underscore-host": "my_reg.com/x",
    "long-256": "r.io/" + "a" * 251, "long-1000": "r.io/" + "/".join(["abcdefghi"] * 100),
    "ipv6-bad": "[::g]:5000/x", "newline": "127.0.0.1:5000/x\nRUN id", "dollar": "127.0.0.1:5000/$x",
    "unicode-host": "rég.com/x", "port-6-digits": "h.com:123456/x",
}
GOOD_REPOSITORIES = {
    "localhost-grammar": "localhost/demo", "ipv6-grammar": "[::1]:5000/demo", "uppercase-host-grammar": "Reg.Example.com/x",
    "double-underscore-grammar": "r.io/a__b", "dash-run-grammar": "r.io/a---b", "port-65535-grammar": "r.io:65535/x",
    "exactly-255-grammar": "r.io/" + "a" * 250,
}
BAD_BASES = {
    "no-digest": "127.0.0.1:5000/demo/base", "tag-only": "127.0.0.1:5000/demo/base:latest",
    "short-digest": "r.io/base@sha256:abc", "upper-hex": "r.io/base@sha256:" + "A" * 64,
    "sha512": "r.io/base@sha512:" + "a" * 128, "double-dot": "r.io/x..y@sha256:" + "a" * 64,
    "label-dash": "r-.io/x@sha256:" + "a" * 64, "port-99999": "r.io:99999/x@sha256:" + "a" * 64,
    "long-name": "r.io/" + "a" * 300 + "@sha256:" + "a" * 64, "bad-tag": "r.io/x:-t@sha256:" + "a" * 64,
    "tag-129": "r.io/x:" + "t" * 129 + "@sha256:" + "a" * 64, "two-ats": "r.io/x@sha256:" + "a" * 64 + "@x",
    "space": "r.io/x @sha256:" + "a" * 64, "empty": "", "uppercase-path": "r.io/X@sha256:" + "a" * 64,
    "uppercase-host": "Reg.io/x@sha256:" + "a" * 64, "uppercase-tag": "r.io/x:V26@sha256:" + "a" * 64,
    "ipv6-host": "[::1]:5000/x@sha256:" + "a" * 64,
}
GOOD_BASES = {"tag-and-digest-grammar": "nvcr.io/nvidia/pytorch:26.07-py3@sha256:" + "a" * 64,
              "no-domain-grammar": "debian@sha256:" + "a" * 64}
BAD_TAGS = {"leading-dot": ".x", "leading-dash": "-x", "129-chars": "t" * 129, "colon": "a:b", "slash": "a/b",
            "space": "a b", "empty": "", "plus": "a+b", "unicode": "tâg", "at": "a@b", "newline": "a\nb"}
GOOD_TAGS = {"underscore-first-grammar": "_x", "128-chars-grammar": "t" * 128, "dots-grammar": "v1.2.3-rc.1"}


def reference_cases() -> list[Case]:
    cases = []
    for name, value in BAD_REPOSITORIES.items():
        cases.append(data_case("reference", f"repository-{name}", "image.repository", {"image.repository": value}))
    for name, value in GOOD_REPOSITORIES.items():
        cases.append(data_case("reference", f"repository-{name}", None, {"image.repository": value}, accept=True))
    for name, value in BAD_BASES.items():
        cases.append(data_case("reference", f"base-{name}", "base.image", {"base.image": value}))
    for name, value in GOOD_BASES.items():
        cases.append(data_case("reference", f"base-{name}", None, {"base.image": value}, accept=True))
    for name, value in BAD_TAGS.items():
        cases.append(data_case("reference", f"tag-{name}", "image.tags[0]", {"image.tags": [value]}))
    for name, value in GOOD_TAGS.items():
        cases.append(data_case("reference", f"tag-{name}", None, {"image.tags": [value]}, accept=True))
    return cases


# ---------------------------------------------------------------- 3. pip options and env names

BAD_PIP = ["--find=/x", "--find-l=/x", "--prefi=/x", "--pref=/x", "--constr=c.txt", "--trusted=h", "--extra=h",
           "--index=h", "--ind=h", "--requir=r", "--targ=/t", "--roo=/r", "--us", "--edit=.", "--conf=x",
           "--global-o=x", "--src=x", "--cert=x", "--proxy=h", "--python=x",
           "-cfoo", "-ihttp://evil", "-rfoo", "-ffoo", "-tfoo", "-efoo", "-Cfoo", "-qcfoo", "-vifoo", "-qU", "-I",
           "-i", "-c", "-x", "--index-url=https://evil", "--extra-index-url=x", "--find-links=/w", "--target=/t",
           "--prefix=/p", "--root=/r", "--user", "--config-settings=a=b", "--no", "--pre", "--upgrade",
           "--no-d", "--no-deps=1", "--only-binary", "--only-binary=:all:;x", "--progress-bar=fancy", "pkg", "-", "--",
           "--no-deps x", "--NO-DEPS"]
GOOD_PIP = {"flags-allowed": "--no-cache-dir", "quiet-cluster-allowed": "-qq", "only-binary-allowed": "--only-binary=:all:",
            "no-binary-list-allowed": "--no-binary=a,b", "verbose-allowed": "-v", "progress-off-allowed": "--progress-bar=off"}
BAD_ENV = ["PIP_FIND_LINKS", "PIP_TARGET", "PIP_PREFIX", "PIP_CONSTRAINT", "PIP_CONFIG_FILE", "PIP_TRUSTED_HOST",
           "PIP_INDEX_URL", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONWARNINGS",
           "PYTHONBREAKPOINT", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "PATH", "HOME",
           "BASH_ENV", "ENV", "HTTPS_PROXY", "NO_PROXY", "UV_INDEX_URL", "SETUPTOOLS_SCM_PRETEND_VERSION",
           "VIRTUAL_ENV", "_PYTHON_SYSCONFIGDATA_NAME", "SSL_CERT_FILE", "GIT_SSH_COMMAND"]
ENV_PLACES = ("build.env", "components.vllm.install.env", "recipe.env")


def pip_env_cases() -> list[Case]:
    cases = []
    for i, arg in enumerate(BAD_PIP):
        cases.append(data_case("pip", f"{i:02d}-{arg[:20]}", "components.megatron.install.pip_args[1]",
                               {"components.megatron.install.pip_args": ["--no-deps", arg]}))
    for name, arg in GOOD_PIP.items():
        cases.append(data_case("pip", name, None, {"components.verl.install.pip_args": ["--no-deps", arg]},
                               accept=True, value=arg))
    for i, name in enumerate(BAD_ENV):
        place = ENV_PLACES[i % len(ENV_PLACES)]
        cases.append(data_case("env", f"{name}-in-{place.split('.')[0]}", f"{place}.{name}",
                               partial(_env, place=place, name=name, value="1")))
    for name in ("PYTHONHASHSEED", "PYTHONUNBUFFERED"):
        cases.append(data_case("env", f"{name}-documented-allowed", None,
                               partial(_env, place="build.env", name=name, value="0"), accept=True))
    for i, value in enumerate(("http://evil/x", "https://h", "ftp://h", "git clone x", "curl", "a wget b", "pip download")):
        place = ("build.env", "components.megatron.install.env")[i % 2]
        cases.append(data_case("env", f"network-value-{i}-in-{place.split('.')[0]}", f"{place}.X",
                               partial(_env, place=place, name="X", value=value), fragment="network"))
    cases.append(data_case("env", "url-in-recipe-env-allowed-not-in-dockerfile", None,
                           lambda d: _env(d, "recipe.env", "X", "http://h/x"), accept=True))
    cases.append(data_case("env", "inner-space-allowed", None,
                           lambda d: _env(d, "build.env", "TORCH_CUDA_ARCH_LIST", "9.0 10.0"), accept=True,
                           value="9.0 10.0"))
    return cases


def _env(data: dict[str, Any], place: str, name: str, value: str) -> None:
    node = data
    for part in place.split("."):
        node = node.setdefault(part, {}) if isinstance(node, dict) else node
    node[name] = value


# ---------------------------------------------------------------- 4. Unicode

CHARS = {"NEL": "\u0085", "LS": "\u2028", "PS": "\u2029", "RLO": "\u202e", "LRE": "\u202a", "LRI": "\u2066",
         "ZWSP": "\u200b", "LRM": "\u200e", "BOM": "\ufeff", "ESC": "\x1b", "DEL": "\x7f", "FF": "\x0c",
         "SHY": "\u00ad", "ALM": "\u061c"}
ESCAPES = {"NEL": "\\N", "LS": "\\L", "PS": "\\P", "RLO": "\\u202e", "ZWSP": "\\u200b", "ESC": "\\e", "BOM": "\\ufeff"}


def unicode_cases() -> list[Case]:
    cases = []
    for name, ch in CHARS.items():
        cases.append(text_case("unicode", f"{name}-in-quoted-value", "build.env.MAX_JOBS",
                               replace('MAX_JOBS: "2"', f'MAX_JOBS: "2{ch}RUN curl x"'), fragment=f"U+{ord(ch):04X}"))
        cases.append(text_case("unicode", f"{name}-in-plain-value", "name",
                               replace("name: demo-true-on-policy", f"name: demo{ch}x"), fragment=f"U+{ord(ch):04X}"))
        cases.append(text_case("unicode", f"{name}-in-key", "build.env.MAX", replace("MAX_JOBS:", f"MAX{ch}JOBS:"),
                               fragment=f"U+{ord(ch):04X}"))
        cases.append(text_case("unicode", f"{name}-in-comment", None, replace("# large enough", f"# large{ch} enough"),
                               fragment=f"U+{ord(ch):04X}"))
    for name, esc in ESCAPES.items():
        cases.append(text_case("unicode", f"{name}-as-escape", "build.env.MAX_JOBS",
                               replace('MAX_JOBS: "2"', f'MAX_JOBS: "2{esc}RUN"'), fragment="not allowed"))
    cases.append(text_case("unicode", "latin-letters-in-reason-quoted", "compat[0].reason",
                           replace("reason: tinycore works", "reason: tinycöre works"), fragment="reason"))
    return cases


# ---------------------------------------------------------------- 5. files

def _lock_case(name: str, make: Callable[[Path], object], fragment: str) -> Case:
    def setup(folder: Path) -> list[str]:
        path = _write_pins(folder, DEMO_TEXT)
        (folder / "locks" / "demo.lock").unlink()
        make(folder / "locks" / "demo.lock")
        return refuse_cmd(path)

    return Case("files", f"lock-{name}", setup, "build.lock", fragment=fragment)


def _pins_file_case(name: str, make: Callable[[Path], object], fragment: str) -> Case:
    def setup(folder: Path) -> list[str]:
        _write_pins(folder, DEMO_TEXT)
        target = folder / "bad.yaml"
        make(target)
        return refuse_cmd(target)

    return Case("files", f"pins-{name}", setup, None, fragment=fragment)


def _loop(path: Path) -> None:
    os.symlink(path.name + ".b", path)
    os.symlink(path.name, path.with_name(path.name + ".b"))


def _sparse(size: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with open(path, "wb") as fh:
            fh.truncate(size)

    return make


def file_cases() -> list[Case]:
    cases = [
        _lock_case("symlink-loop", _loop, "symlink loop"),
        _lock_case("not-utf8", lambda p: p.write_bytes(b"tinyx==1.0 \xff\xfe\n"), "UTF-8"),
        _lock_case("directory", lambda p: p.mkdir(), "directory"),
        _lock_case("fifo", lambda p: os.mkfifo(p), "regular"),
        _lock_case("symlink-to-dev-zero", lambda p: os.symlink("/dev/zero", p), "inside"),
        _lock_case("missing", lambda p: None, "No such file"),
        _lock_case("sparse-20GB", _sparse(20 * 2**30), "bytes"),
        _pins_file_case("symlink-loop", _loop, "symlink loop"),
        _pins_file_case("not-utf8", lambda p: p.write_bytes(b"name: \xff\xfe\n"), "UTF-8"),
        _pins_file_case("utf16", lambda p: p.write_bytes(DEMO_TEXT.encode("utf-16")), "UTF-8"),
        _pins_file_case("directory", lambda p: p.mkdir(), "directory"),
        _pins_file_case("fifo", lambda p: os.mkfifo(p), "regular"),
        _pins_file_case("dev-zero", lambda p: os.symlink("/dev/zero", p), "regular"),
        _pins_file_case("missing", lambda p: None, "No such file"),
        _pins_file_case("sparse-20MB", _sparse(20 * 2**20), "bytes"),
        _pins_file_case("sparse-2GB", _sparse(2 * 2**30), "bytes"),
    ]

    def cold(folder: Path) -> list[str]:
        return refuse_cmd(_write_pins(folder, DEMO_TEXT))

    cases.append(Case("files", "offline-cold-cache-names-field", cold, "components.vllm.url", fragment="mirror cache"))
    return cases


# ---------------------------------------------------------------- 6. bounds and cross-field rules

def _steps(n: Any) -> dict[str, Any]:
    return {"acceptance.steps": n, "recipe.overrides.trainer.total_training_steps": n}


def _override(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["recipe"]["overrides"][key] = value

    return edit


def _same(what: str, shared: bool) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["components"]["verl"][what] = data["components"]["vllm"][what]
        if shared:
            data["shared"] = [what]

    return edit


def _mount(source: str, target: str = "/data/x") -> dict[str, Any]:
    return {"acceptance.mounts": [{"source": source, "target": target}]}


def bounds_cases() -> list[Case]:
    cases = []
    v: object  # each loop tries values of many types
    for v in (0, -1, 86401, 10**12, 1e12, 1.5, "10", True, float("inf"), float("nan"), None):
        cases.append(data_case("bounds", f"timeout_s-{v!r}", "acceptance.timeout_s", {"acceptance.timeout_s": v}))
    for v in (1, 0, 100_001, 10**12, 1e12, 2.0, "2", True):
        cases.append(data_case("bounds", f"steps-{v!r}", "acceptance.steps", {"acceptance.steps": v}))
    cases.append(data_case("bounds", "steps-override-mismatch", "recipe.overrides[trainer.total_training_steps]",
                           {"recipe.overrides": {**DEMO["recipe"]["overrides"], "trainer.total_training_steps": 3}}))
    for v in (-1, 65, 1000, 1.0, "8", True):
        cases.append(data_case("bounds", f"gpus-{v!r}", "acceptance.gpus", {"acceptance.gpus": v}))
    lr_key = "actor_rollout_ref.actor.optim.lr"
    for v in (float("inf"), float("-inf"), float("nan"), 0, 0.0, -0.001, 11, 1e12, "0.1", True, None, [0.1]):
        cases.append(data_case("bounds", f"lr-{v!r}", f"recipe.overrides[{lr_key}]" if not isinstance(v, list)
                               and v is not None else "recipe.overrides", _override(lr_key, v)))
    cases.append(data_case("bounds", "override-nan", "recipe.overrides.seed", _override("seed", float("nan"))))
    for name, v in (("empty", []), ("unknown", ["bogus"]), ("twice", ["control", "control"]), ("string", "control")):
        cases.append(data_case("bounds", f"required_gates-{name}", "acceptance.required_gates",
                               {"acceptance.required_gates": v}))
    for v in (1.0, "1", 2, 0, True, None):
        cases.append(data_case("bounds", f"schema_version-{v!r}", "schema_version", {"schema_version": v}))
    for what in ("url", "commit", "distribution"):
        cases.append(data_case("bounds", f"same-{what}", f"components.verl.{what}", _same(what, False)))
        cases.append(data_case("bounds", f"same-{what}-shared-allowed", None, _same(what, True), accept=True))
    cases.append(data_case("bounds", "same-distribution-normalised", "components.verl.distribution",
                           {"components.verl.distribution": "TinyEngine"}))
    for src in ("/", "/..", "/.", "/etc/..", "//", "/./.", "/var/run/docker.sock", "/run/docker.sock", "/var/run",
                "/run", "/var", "/var/lib", "/proc", "/proc/self", "/sys", "/sys/fs", "/dev", "/dev/shm",
                "/var/lib/docker", "/var/lib/docker/volumes", "/x/../proc", "/data/../../dev", "/etc",
                "/var/lib/containerd", "/root", "/home/../var/run/docker.sock", "/x/y.sock", "relative/path"):
        cases.append(data_case("bounds", f"mount-source-{src}", "acceptance.mounts[0].source", _mount(src)))
    for target in ("/", "/proc", "/x/..", "/dev/x", "relative"):
        cases.append(data_case("bounds", f"mount-target-{target}", "acceptance.mounts[0].target", _mount("/data/x", target)))
    cases.append(data_case("bounds", "mount-targets-equal-after-normalising", "acceptance.mounts",
                           {"acceptance.mounts": [{"source": "/data/a", "target": "/d"},
                                                  {"source": "/data/b", "target": "/d/."}]}))
    cases.append(data_case("bounds", "mount-data-allowed", None, _mount("/data/dapo", "/data/dapo"), accept=True))
    return cases


# ---------------------------------------------------------------- 7. command-line usage

USAGE = {
    "unknown-option": (["resolve", "--bogus", "{pins}"], "--bogus"),
    "unknown-command": (["frobnicate"], "frobnicate"),
    "missing-argument": (["resolve"], "pins_path"),
    "missing-report": (["publish"], "report_json"),
    "option-needs-value": (["report", "{pins}", "--format"], "--format"),
    "extra-argument": (["resolve", "{pins}", "extra"], "extra"),
    "timeout-not-int": (["accept", "{pins}", "--timeout", "abc"], "--timeout"),
    "timeout-float": (["accept", "{pins}", "--timeout", "1.5"], "--timeout"),
    "flag-with-value": (["run", "{pins}", "--publish=maybe"], "--publish"),
    "unknown-short": (["resolve", "-x", "{pins}"], "-x"),
    "image-needs-value": (["publish", "{pins}", "--image"], "--image"),
    "json-needs-path": (["resolve", "{pins}", "--json"], "--json"),
    "render-unknown-option": (["render", "--pins-onlyy", "{pins}"], "--pins-onlyy"),
    "gate-needs-value": (["accept", "{pins}", "--gate"], "--gate"),
    "double-dash-unknown": (["build", "--no-cache", "{pins}"], "--no-cache"),
}


def usage_cases() -> list[Case]:
    cases = []
    for name, (argv, fragment) in USAGE.items():
        def setup(folder: Path, argv: list[str] = argv) -> list[str]:
            pins = _write_pins(folder, DEMO_TEXT)
            return [str(pins) if a == "{pins}" else a for a in argv]

        cases.append(Case("usage", name, setup, None, fragment=fragment))
    cases.append(Case("usage", "report-format-pdf",
                      lambda f: ["report", str(_write_report(f, lambda r: None)), "--format", "pdf"], "--format"))
    cases.append(Case("usage", "accept-timeout-out-of-range",
                      lambda f: ["accept", str(_write_pins(f, DEMO_TEXT)), "--timeout", "99999999",
                                 "--image", "sha256:" + "0" * 64], None, fragment="--timeout"))
    return cases


# ---------------------------------------------------------------- 8. edited reports

def accepted_report(folder: Path) -> tuple[dict[str, Any], Path]:
    """An ACCEPTED report.json (as builder.report.document writes it) for a pins file in `folder`."""
    from builder.core.records import AcceptanceResult, BuiltImage, Evidence, GateResult, ResolvedComponent, ResolvedSources
    from builder.lock import record as lock_record
    from builder.pins import model as pins_mod
    from builder.report import document as report_mod

    pins = pins_mod.load(_write_pins(folder, DEMO_TEXT, "pins.yaml"))
    image = "sha256:" + "ab" * 32
    comps = {name: ResolvedComponent(
        name=name, url=c.url, target=c.target, pr=c.pr, commit=c.commit, tree="1" * 40, commit_time=0,
        pr_head=c.commit, pr_moved=False, merge_base="2" * 40, ahead=1, behind=0, target_head="3" * 40,
        export_sha256="4" * 64, files=3) for name, c in pins.components.items()}
    sources = ResolvedSources(pins_path=str(pins.path), pins_sha256=pins.sha256, resolved_at="2026-11-01T00:00:00Z",
                              components=comps)
    steps = {str(s): {"diff_max": 0.0, "k3_kl": 0.0, "reward": 0.5, "loss": -0.1,
                      "weights_before": f"w{s}", "weights_after": f"w{s + 1}"} for s in (1, 2)}
    evidence: dict[str, dict[str, Any]] = {"provenance": {"failures": []},
                "zero_update": {"exit_code": 0, "steps": {k: {"diff_max": 0.0, "k3_kl": 0.0} for k in steps},
                                "weights": ["w0"]},
                "rl_step": {"exit_code": 0, "steps": steps},
                "control": {"exit_code": 0, "diff_max": 0.0123},
                "performance": {"runs": [{"run": r, "arm": arm, "status": "pass", "throughput": value}
                                         for r in (1, 2, 3) for arm, value in (("aligned", 450.0), ("control", 1000.0))]}}
    gates = [GateResult(name=g, status="pass", reason=f"{g} pass", evidence=Evidence.model_validate(e))
             for g, e in evidence.items()]
    built = BuiltImage(image_id=image, tags=[], size=1, created="", engine_version="", builder_version="",
                       context_sha256="", dockerfile_sha256="", stage_times={}, log_path="", cached=True)
    acceptance = AcceptanceResult(image_id=image, gates=gates)
    report = report_mod.make_report(pins, lock_record.of(pins), sources, built, acceptance)
    assert report.verdict == "ACCEPTED", report.reasons
    path = folder / "report.json"
    path.write_text(report.model_dump_json(indent=2))
    return json.loads(path.read_text()), path


def _write_report(folder: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    data, path = accepted_report(folder)
    result = edit(data)
    if isinstance(result, (str, bytes)):
        path.write_bytes(result if isinstance(result, bytes) else result.encode())
    else:
        path.write_text(json.dumps(data, indent=2))
    return path


def _gate(data: dict[str, Any], name: str, where: str = "acceptance") -> dict[str, Any]:
    gates = data["acceptance"]["gates"] if where == "acceptance" else data["gates"]
    return next(g for g in gates if g["name"] == name)


def _both(data: dict[str, Any], name: str, change: Callable[[dict[str, Any]], object]) -> None:
    change(_gate(data, name))
    change(_gate(data, name, "top"))


def _fail(gate: dict[str, Any]) -> None:
    gate.update(status="fail")


def _fail_in_acceptance(data: dict[str, Any], name: str) -> None:
    _gate(data, name).update(status="fail")


def _drop_required(data: dict[str, Any], name: str) -> None:
    data.update(required_gates=[x for x in data["required_gates"] if x != name])


def _drop_gate(data: dict[str, Any], name: str) -> None:
    data.update(gates=[x for x in data["gates"] if x["name"] != name])


def _both_evidence(data: dict[str, Any], name: str, change: Callable[[dict[str, Any]], object]) -> None:
    _both(data, name, lambda x: change(x["evidence"]))


def report_case(name: str, field_: str | None, edit: Callable[[dict[str, Any]], Any], fragment: str = "") -> Case:
    return Case("report", name, lambda f: ["publish", str(_write_report(f, edit))], field_, fragment=fragment)


def report_cases() -> list[Case]:
    cases = []

    def dup(where: str) -> Callable[[dict[str, Any]], None]:
        def edit(d: dict[str, Any]) -> None:
            lists = [d["acceptance"]["gates"], d["gates"]] if where == "both" else \
                [d["acceptance"]["gates"] if where == "acceptance" else d["gates"]]
            for gates in lists:
                first = copy.deepcopy(next(g for g in gates if g["name"] == "control"))
                first.update(status="fail", reason="control failed")
                gates.insert(0, first)

        return edit

    cases.append(report_case("control-twice-in-gates", "gates", dup("top"), "more than once"))
    cases.append(report_case("control-twice-in-acceptance", "acceptance.gates", dup("acceptance"), "more than once"))
    cases.append(report_case("control-twice-in-both", "gates", dup("both"), "more than once"))
    for gate in ("provenance", "zero_update", "rl_step", "control"):
        cases.append(report_case(f"copies-disagree-{gate}", "gates",
                                 partial(_fail_in_acceptance, name=gate), "disagrees"))
        cases.append(report_case(f"fail-under-accepted-{gate}", f"acceptance.gates.{gate}",
                                 partial(_both, name=gate, change=_fail), "not pass"))
        cases.append(report_case(f"required-cut-{gate}", "required_gates",
                                 partial(_drop_required, name=gate),
                                 "drops"))
        cases.append(report_case(f"gate-missing-{gate}", "gates",
                                 partial(_drop_gate, name=gate), "missing"))
    cases.append(report_case("required-empty", "required_gates", lambda d: d.update(required_gates=[]), "drops"))
    cases.append(report_case("reasons-non-empty", "reasons", lambda d: d.update(reasons=["rl_step failed"]), "reasons"))
    evidence_edits = {
        "zero-diff-nonzero": ("zero_update", lambda e: e["steps"]["2"].update(diff_max=1e-6)),
        "zero-k3-nonzero": ("zero_update", lambda e: e["steps"]["1"].update(k3_kl=0.5)),
        "zero-step-missing": ("zero_update", lambda e: e["steps"].pop("2")),
        "zero-weights-changed": ("zero_update", lambda e: e.update(weights=["a", "b"])),
        "zero-diff-string": ("zero_update", lambda e: e["steps"]["1"].update(diff_max="0")),
        "zero-exit-1": ("zero_update", lambda e: e.update(exit_code=1)),
        "rl-weights-same": ("rl_step", lambda e: e["steps"]["1"].update(weights_after="w1")),
        "rl-loss-null": ("rl_step", lambda e: e["steps"]["2"].update(loss=None)),
        "rl-diff-nonzero": ("rl_step", lambda e: e["steps"]["1"].update(diff_max=0.1)),
        "rl-no-steps": ("rl_step", lambda e: e.pop("steps")),
        "control-diff-zero": ("control", lambda e: e.update(diff_max=0.0)),
        "control-diff-missing": ("control", lambda e: e.pop("diff_max")),
        "control-exit-bool": ("control", lambda e: e.update(exit_code=False)),
        "provenance-failures": ("provenance", lambda e: e.update(failures=["site-packages mounted"])),
        "provenance-no-failures-key": ("provenance", lambda e: e.pop("failures")),
    }
    for name, (gate, change) in evidence_edits.items():
        cases.append(report_case(f"evidence-{name}", f"acceptance.gates.{gate}.evidence",
                                 partial(_both_evidence, name=gate, change=change), "does not support"))

    def pins_edited(d: dict[str, Any]) -> None:
        Path(d["sources"]["pins_path"]).write_text(DEMO_TEXT.replace("seed: 1", "seed: 2"))

    cases.append(report_case("pins-edited-after", "sources.pins_sha256", pins_edited, "sha256"))
    cases.append(report_case("pins-gone", "sources.pins_path", lambda d: Path(d["sources"]["pins_path"]).unlink(),
                             "re-read"))
    cases.append(report_case("pins-sha-edited", "sources.pins_sha256",
                             lambda d: d["sources"].update(pins_sha256="0" * 64), "sha256"))
    cases.append(report_case("tags-latest-added", "tags", lambda d: d["tags"].append("latest"), "pins give"))
    cases.append(report_case("repository-changed", "repository",
                             lambda d: d.update(repository="127.0.0.1:5000/other/x"), "pins give"))
    cases.append(report_case("name-changed", "name", lambda d: d.update(name="other"), "pins give"))
    cases.append(report_case("commit-changed", "sources.components.verl.commit",
                             lambda d: d["sources"]["components"]["verl"].update(commit="f" * 40), "pinned"))
    cases.append(report_case("image-id-mismatch", "image_id",
                             lambda d: d["acceptance"].update(image_id="sha256:" + "cd" * 32), "different images"))
    cases.append(report_case("no-acceptance", "acceptance", lambda d: d.update(acceptance=None), "no acceptance"))
    cases.append(report_case("not-json", None, lambda d: "{not json", "not a report"))
    cases.append(report_case("deep-json", None, lambda d: '{"a":' + "[" * 100_000 + "]" * 100_000 + "}", "not a report"))
    cases.append(report_case("not-utf8", None, lambda d: b'{"verdict": "\xff"}', "UTF-8"))
    cases.append(report_case("extra-field", None, lambda d: d.update(trusted=True), "not a report"))
    cases.append(Case("report", "report-is-fifo", lambda f: ["publish", str(_fifo(f / "r.json"))], None, fragment="regular"))
    cases.append(Case("report", "report-symlink-loop", lambda f: ["publish", str(_looped(f / "r.json"))], None,
                      fragment="symlink loop"))
    return cases


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _looped(path: Path) -> Path:
    _loop(path)
    return path


def all_cases() -> list[Case]:
    return (parser_cases() + reference_cases() + pip_env_cases() + unicode_cases() + file_cases() + bounds_cases()
            + usage_cases() + report_cases())


# ---------------------------------------------------------------- running one case in-process

class RegistryCalled(AssertionError):
    pass


def run_in_process(argv: list[str], calls: list[str]) -> Outcome:
    """The real CLI (builder.core.usage.run_app), output captured; registry and engine replaced by tripwires."""
    from builder import cli
    from builder.engine import client as engine
    from builder.release import publish

    class Tripwire:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls.append(f"Registry{args}")
            raise RegistryCalled("registry contacted")

    def no_engine(*args: Any, **kwargs: Any) -> Any:
        calls.append("engine.connect")
        raise RegistryCalled("engine contacted")

    out, err = io.StringIO(), io.StringIO()
    crashed = ""
    try:
        with mock.patch.object(publish, "Registry", Tripwire), mock.patch.object(engine, "connect", no_engine), \
                redirect_stdout(out), redirect_stderr(err):
            code = cli.run(argv)
    except RegistryCalled:
        code = -1
    except BaseException:  # noqa: BLE001 - a traceback is what the corpus looks for
        crashed = traceback.format_exc()
        code = -2
    return Outcome(code, out.getvalue(), err.getvalue(), crashed, calls)


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under folder with a hash of regular files (to see that nothing was created or changed)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                found[str(path)] = "other"
            elif path.stat().st_size < 2**22:
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[str(path)] = str(path.stat().st_size)
    return found
