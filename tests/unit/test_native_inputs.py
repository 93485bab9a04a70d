"""Native build inputs in the lock (builder/lock/native.py) and the lock's requirement adjustments:
GIT_TAG resolved to a commit through the mirror cache (insteadOf applies), lock lines, what --check
names when a GIT_TAG changes; direct URLs, torch pins relaxed to the base's torch, build tools over the base."""
import dataclasses
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.engine.basecontainer import BaseInfo
from builder.lock import lockfile as lock
from builder.lock import native
from builder.sources import cmakefetch
from demo.make_stack import make_stack

BASE = BaseInfo(image="base", python="3.11", abi="cp311", machine="x86_64", glibc=(2, 36),
                markers={"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64"},
                dists={"torch": "2.13.0+cpu", "setuptools": "84.2.1", "numpy": "2.1.0"})


# ---------------------------------------------------------------- requirement adjustments (no Docker)


def test_direct_url_requirement_is_an_error_naming_it() -> None:
    with pytest.raises(BadInput, match=r"components.vllm: 'triton @ https://example.invalid/triton-3.8.0.whl': a direct"
                                       r" URL requirement cannot be locked by hash.*direct_urls entry mapping triton"):
        lock.applicable(["triton @ https://example.invalid/triton-3.8.0.whl"], BASE, "components.vllm", set(),
                        lock.Adjust())


def test_direct_url_mapped_by_the_pins_is_locked_from_the_index() -> None:
    adjust = lock.Adjust(direct={"triton": "3.6.0"})
    out = lock.applicable(["triton @ https://example.invalid/triton-3.8.0.whl ; sys_platform == 'linux'"], BASE,
                          "components.vllm", set(), adjust)
    assert out == ["triton==3.6.0"]
    assert adjust.notes == [f"{native.DIRECT_MARK}components.vllm: triton @ https://example.invalid/triton-3.8.0.whl ;"
                            " sys_platform == 'linux' -> triton==3.6.0"]


def test_exact_torch_pins_are_relaxed_to_the_bases_torch_only_with_base_torch() -> None:
    reqs = ["torch==2.14.0", "torchvision==0.29.0", "numpy>=1.26"]
    adjust = lock.Adjust(base_torch=True)
    assert lock.applicable(reqs, BASE, "components.vllm: build-system", set(), adjust) == \
        ["numpy>=1.26", "torch", "torchvision==0.29.0"]  # the base has no torchvision: nothing to keep
    assert adjust.notes == [f"{native.RELAXED_MARK}components.vllm: build-system: torch==2.14.0 -> torch"
                            " (the base's torch 2.13.0+cpu)"]
    kept = lock.applicable(reqs, BASE, "components.vllm", set(), lock.Adjust())
    with pytest.raises(BadInput, match=r"requires 'torch==2.14.0' but the base provides torch 2.13.0\+cpu"):
        lock.check_against(kept, BASE.dists, "components.vllm", "the base")


def test_build_tools_over_the_base_go_to_the_build_prefix_but_torch_never() -> None:
    assert lock.tools_over_base(["setuptools<81.0.0,>=77.0.3", "cmake>=3.26", "torch==2.14.0"], BASE.dists) == \
        ["setuptools"]
    assert lock.without(BASE.dists, ["setuptools"]) == {"torch": "2.13.0+cpu", "numpy": "2.1.0"}


# ---------------------------------------------------------------- lock lines


def an_input(**changes: Any) -> native.NativeInput:
    item = native.NativeInput("vllm", "tinykernels", "../tinykernels.git", "v0.1.0", "a" * 40, "b" * 40, "c" * 64,
                              "TINYKERNELS_SRC_DIR", "cmake/kernels.cmake:18")
    return dataclasses.replace(item, **changes)


def test_lock_lines_read_back() -> None:
    locked = native.Locked(cmake=["vllm"], inputs=[an_input(when=['X STREQUAL "cuda"', "NOT (Y)"])])
    text = "\n".join(native.lock_lines(locked)) + "\n# base-record: torch 2.13.0+cpu torch-2.13.0+cpu.dist-info/RECORD" \
        " sha256=" + "d" * 64 + "\n"
    back = native.parse(text)
    assert back.cmake == ["vllm"] and back.inputs == locked.inputs
    assert back.base_records["torch"]["record"] == "torch-2.13.0+cpu.dist-info/RECORD"
    with pytest.raises(BadInput, match=r"^lock:1: expected '# native: <component>"):
        native.parse("# native: vllm tinykernels x ref=v1\n")


def test_check_names_a_changed_git_tag() -> None:
    old = native.Locked(cmake=["vllm"], inputs=[an_input()])
    new = native.Locked(cmake=["vllm"], inputs=[an_input(ref="v0.2.0", commit="e" * 40)])
    assert native.changes(old, new) == ["native input vllm/tinykernels: GIT_TAG v0.1.0 -> v0.2.0 (../tinykernels.git)"]
    assert native.changes(old, native.Locked(cmake=["vllm"])) == ["native input vllm/tinykernels: no longer declared"]
    assert native.changes(old, old) == []


# ---------------------------------------------------------------- tag -> commit through the mirror cache


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("stack")
    return out, make_stack(out)


def decl(url: str, tag: str) -> cmakefetch.Declaration:
    return cmakefetch.Declaration("tinykernels", url, tag, file="cmake/kernels.cmake:18")


def test_tag_resolves_to_its_commit_relative_to_the_component(stack: tuple[Path, dict[str, Any]], settings: Settings) -> None:
    out, st = stack
    item = native.resolve_input(settings, "vllm", str(out / "tinyengine.git"), decl("../tinykernels.git", "v0.1.0"))
    tags = st["native"]["tinykernels"]["tags"]
    assert item.commit == tags["v0.1.0"] and item.commit != tags["v0.2.0"]
    assert item.receive == "FETCHCONTENT_SOURCE_DIR_TINYKERNELS" and len(item.export_sha256) == 64
    assert native.export_file(settings, None, item).is_file()  # type: ignore[arg-type]  # cached: pins unread
    branch = native.resolve_input(settings, "vllm", str(out / "tinyengine.git"), decl("../tinykernels.git", "main"))
    assert branch.commit == st["native"]["tinykernels"]["main"]


def test_unknown_tag_and_url_archives_are_errors_naming_the_input(stack: tuple[Path, dict[str, Any]], settings: Settings) -> None:
    out, _ = stack
    with pytest.raises(BadInput, match=r"native input tinykernels \(cmake/kernels.cmake:18\): GIT_TAG v9: no tag or"
                                       r" branch of that name"):
        native.resolve_input(settings, "vllm", str(out / "tinyengine.git"), decl("../tinykernels.git", "v9"))
    archive = cmakefetch.Declaration("onednn", "", "", url="https://example.invalid/x.tar.gz", file="CMakeLists.txt:3")
    with pytest.raises(BadInput, match=r"native input onednn .*archive downloads are not supported"):
        native.resolve_input(settings, "vllm", str(out / "tinyengine.git"), archive)


def test_git_insteadof_applies(stack: tuple[Path, dict[str, Any]], settings: Settings, tmp_path: Path) -> None:
    out, st = stack
    shutil.copytree(out / "tinykernels.git", tmp_path / "mirror-of-kernels.git")
    config = tmp_path / "gitconfig"
    config.write_text(f'[url "file://{tmp_path}/mirror-of-kernels.git"]\n'
                      "\tinsteadOf = https://kernels.example.invalid/tinykernels.git\n")
    rewritten = dataclasses.replace(settings, git_config=config, cache_root=tmp_path / "cache")
    item = native.resolve_input(rewritten, "vllm", str(out / "tinyengine.git"),
                                decl("https://kernels.example.invalid/tinykernels.git", "v0.2.0"))
    assert item.commit == st["native"]["tinykernels"]["tags"]["v0.2.0"]
    assert item.url == "https://kernels.example.invalid/tinykernels.git"  # recorded as the build declares it


def test_the_demo_engine_declares_tinykernels_by_tag_for_cpu_and_more_for_cuda(stack: tuple[Path, dict[str, Any]]) -> None:
    import pygit2

    out, st = stack
    repo = pygit2.Repository(str(out / "tinyengine.git"))
    head = st["repos"]["tinyengine"]["prs"]["11"]["head"]
    cpu = cmakefetch.discover_at(repo, head, {"TINYENGINE_TARGET_DEVICE": "cpu"})
    assert [(d.name, d.git_repository, d.git_tag, d.receive, d.when) for d in cpu.declarations] == \
        [("tinykernels", "../tinykernels.git", "v0.1.0", "TINYKERNELS_SRC_DIR", [])]
    cuda = cmakefetch.discover_at(repo, head, {"TINYENGINE_TARGET_DEVICE": "cuda"})
    assert [d.name for d in cuda.declarations] == ["tinykernels", "tinykernels_cuda"]
    defect = cmakefetch.discover_at(repo, st["repos"]["tinyengine"]["prs"]["15"]["head"],
                                    {"TINYENGINE_TARGET_DEVICE": "cpu"})
    assert [d.name for d in defect.declarations] == ["tinykernels"]  # tinyextra hides in add_subdirectory()


# ---------------------------------------------------------------- pins: build knobs


@pytest.mark.parametrize(("native", "env", "message"), [
    ({"device": "cpu", "cuda_arch": ["9.0"], "device_var": "VLLM_TARGET_DEVICE"}, {},
     "cuda_arch: expected only with device 'cuda'"),
    ({"device": "cuda", "device_var": "VLLM_TARGET_DEVICE"}, {}, "cuda_arch: expected the arch list"),
    ({"device": "cpu"}, {}, "device_var: required with device"),
    ({"device": "cuda", "device_var": "VLLM_TARGET_DEVICE", "cuda_arch": ["sm_90"]}, {},
     "expected a CUDA arch like '9.0', '10.0a' or '8.0+PTX', got 'sm_90'"),
    ({"max_jobs": 8}, {"MAX_JOBS": "2"}, "install.env: expected MAX_JOBS set once, by native"),
    ({"max_jobs": 0}, {}, "expected a job count in 1..1024"),
])
def test_bad_build_knobs_are_one_line_naming_the_field(native: dict[str, Any], env: dict[str, Any], message: str) -> None:
    from builder.pins import model as pins_mod

    comp = {"url": "/x/repo.git", "target": "main", "pr": 1, "commit": "a" * 40, "distribution": "vllm",
            "modules": ["vllm"], "install": {"env": env}, "native": native}
    with pytest.raises(Exception, match=re.escape(message)):
        pins_mod.Component.model_validate(comp)


def test_build_knobs_become_the_build_steps_env() -> None:
    from builder.pins import model as pins_mod

    comp = pins_mod.Component.model_validate({
        "url": "/x/repo.git", "target": "main", "pr": 1, "commit": "a" * 40, "distribution": "vllm",
        "modules": ["vllm"], "base_torch": True, "install": {"env": {"VLLM_USE_PRECOMPILED": "0"}},
        "native": {"device": "cuda", "device_var": "VLLM_TARGET_DEVICE", "cuda_arch": ["9.0", "10.0a"],
                   "max_jobs": 16, "nvcc_threads": 2, "modules": ["vllm._C"]}})
    assert comp.build_env() == {"VLLM_USE_PRECOMPILED": "0", "VLLM_TARGET_DEVICE": "cuda",
                                "TORCH_CUDA_ARCH_LIST": "9.0 10.0a", "MAX_JOBS": "16", "NVCC_THREADS": "2"}
