"""vLLM 0.33.0's own cpu requirement lines (requirements/cpu.txt) through the lock's adjustments."""
import pytest

from builder.core.errors import BadInput
from builder.engine.basecontainer import BaseInfo
from builder.lock.lockfile import Adjust, applicable

MARKERS = {"platform_machine": "x86_64", "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
           "python_version": "3.11", "python_full_version": "3.11.0", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "platform_release": "", "platform_version": "",
           "implementation_version": "3.11.0"}
BASE = BaseInfo(image="base", python="3.11", abi="cp311", machine="x86_64", glibc=(2, 35), markers=MARKERS,
                dists={"torch": "2.13.0+cpu", "setuptools": "84.2.1"})
CPU_TXT = [
    "setuptools==78.1.1",
    'torch==2.14.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x"',
    'torch==2.14.0; platform_system == "Darwin" or platform_machine == "ppc64le"',
    "triton @ https://github.com/triton-lang/triton-cpu/releases/download/v3.8.0/"
    'triton-3.8.0+cpu-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl ; platform_machine == "x86_64"'
    ' and python_version == "3.11"',
    "numba == 0.65.0",
]


def test_cpu_requirements_with_base_torch_and_a_mapped_direct_url() -> None:
    adjust = Adjust(base_torch=True, direct={"triton": "3.9.0"})
    out = applicable(CPU_TXT, BASE, "vllm: Requires-Dist", set(), adjust, runtime=True)
    assert out == ["numba==0.65.0", "setuptools", "torch", "triton==3.9.0"]
    notes = "\n".join(adjust.notes)
    assert "relaxed: vllm: Requires-Dist: setuptools==78.1.1 -> setuptools (the base's setuptools 84.2.1)" in notes
    assert "torch==2.14.0+cpu -> torch (the base's torch 2.13.0+cpu)" in notes
    assert "direct-url: " in notes and "-> triton==3.9.0" in notes


def test_a_build_requirement_on_a_build_tool_is_not_relaxed() -> None:
    # [build-system].requires setuptools<81 goes into the build-tools prefix instead (tools_over_base)
    adjust = Adjust(base_torch=True)
    assert applicable(["setuptools>=77.0.3,<81.0.0"], BASE, "vllm: build-system", set(), adjust) == \
        ["setuptools<81.0.0,>=77.0.3"]
    assert adjust.notes == []


def test_without_base_torch_nothing_is_relaxed_and_the_direct_url_is_an_error() -> None:
    adjust = Adjust()
    assert applicable(["setuptools==78.1.1"], BASE, "w", set(), adjust, runtime=True) == ["setuptools==78.1.1"]
    with pytest.raises(BadInput, match="direct_urls entry mapping triton"):
        applicable(CPU_TXT[3:4], BASE, "w", set(), adjust, runtime=True)


def test_cmake_vars_decide_a_declaration_that_depends_on_the_build_host() -> None:
    # vLLM's cpu_extension.cmake: an aarch64 oneDNN commit when ASIMD_FOUND (from /proc/cpuinfo), else v3.13
    from types import SimpleNamespace

    from builder.lock import native
    from builder.sources import cmakefetch

    files = {"CMakeLists.txt": 'include(FetchContent)\nif(ASIMD_FOUND AND NOT APPLE_SILICON_FOUND)\n'
             '  FetchContent_Declare(oneDNN GIT_REPOSITORY https://x/oneDNN.git'
             ' GIT_TAG 9c5be1cc59e368aebf0909e6cf20f981ea61462a)\n'
             'else()\n  FetchContent_Declare(oneDNN GIT_REPOSITORY https://x/oneDNN.git GIT_TAG v3.13)\nendif()\n'}
    with pytest.raises(BadInput, match="a second, different declaration"):
        cmakefetch.discover(files.get, {}, {})
    pin = SimpleNamespace(native=SimpleNamespace(cmake_vars={"ASIMD_FOUND": "OFF"}, device="cpu",
                                                 device_var="VLLM_TARGET_DEVICE"))
    known = native.known_vars(pin)  # type: ignore[arg-type]  # only .native is read
    assert known == {"ASIMD_FOUND": "OFF", "VLLM_TARGET_DEVICE": "cpu"}
    [decl] = cmakefetch.discover(files.get, known, {}).declarations
    assert decl.git_tag == "v3.13"
