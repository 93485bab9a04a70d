"""Native build inputs found in a component's CMake files (builder/sources/cmakefetch.py)."""
from pathlib import Path

import pygit2
import pytest

from builder.core.errors import BadInput
from builder.sources import cmakefetch as cf

VLLM_LIKE = {
    "CMakeLists.txt": r'''
cmake_minimum_required(VERSION 3.26)
project(vllm_extensions LANGUAGES CXX)
set(VLLM_TARGET_DEVICE "cuda" CACHE STRING "Target device backend")
include(${CMAKE_CURRENT_LIST_DIR}/cmake/utils.cmake)
include(FetchContent)
if (VLLM_TARGET_DEVICE STREQUAL "cpu")
  include(${CMAKE_CURRENT_LIST_DIR}/cmake/cpu_extension.cmake)
  return()
endif()
if (NOT HIP_FOUND AND CUDA_FOUND)
  set(VLLM_GPU_LANG "CUDA")
endif()
if(VLLM_GPU_LANG STREQUAL "CUDA")
  set(CUTLASS_REVISION "v4.2.1")
  if (DEFINED ENV{VLLM_CUTLASS_SRC_DIR})
    set(VLLM_CUTLASS_SRC_DIR $ENV{VLLM_CUTLASS_SRC_DIR})
  endif()
  if(VLLM_CUTLASS_SRC_DIR)
    FetchContent_Declare(cutlass SOURCE_DIR ${VLLM_CUTLASS_SRC_DIR})
  else()
    FetchContent_Declare(
        cutlass
        GIT_REPOSITORY https://github.com/nvidia/cutlass.git
        # Please keep this in sync with CUTLASS_REVISION line above.
        GIT_TAG ${CUTLASS_REVISION}
        GIT_SHALLOW TRUE
    )
  endif()
  FetchContent_MakeAvailable(cutlass)
endif()
include(cmake/external_projects/flashmla.cmake)
''',
    "cmake/utils.cmake": "function(helper)\n  FetchContent_Declare(never GIT_REPOSITORY x GIT_TAG y)\nendfunction()\n",
    "cmake/cpu_extension.cmake": r'''
set(ONEDNN_TAG [[v3.13]])
if ((AVX512_FOUND AND NOT AVX512_DISABLED) OR (ASIMD_FOUND AND NOT APPLE_SILICON_FOUND) OR POWER9_FOUND)
  if(ASIMD_FOUND)
    FetchContent_Populate(arm_compute
      SOURCE_DIR   "${FETCHCONTENT_BASE_DIR}/arm_compute-src"
      GIT_REPOSITORY https://github.com/ARM-software/ComputeLibrary.git
      GIT_TAG        v52.6.0)
  endif()
  set(FETCHCONTENT_SOURCE_DIR_ONEDNN "$ENV{FETCHCONTENT_SOURCE_DIR_ONEDNN}" CACHE PATH "Path to a local oneDNN.")
  if(FETCHCONTENT_SOURCE_DIR_ONEDNN)
    FetchContent_Declare(oneDNN SOURCE_DIR ${FETCHCONTENT_SOURCE_DIR_ONEDNN})
  else()
    FetchContent_Declare(oneDNN GIT_REPOSITORY "https://github.com/uxlfoundation/oneDNN.git" GIT_TAG "${ONEDNN_TAG}")
  endif()
  FetchContent_MakeAvailable(oneDNN)
endif()
''',
    "cmake/external_projects/flashmla.cmake": r'''
if(FLASH_MLA_SRC_DIR)
  FetchContent_Declare(flashmla SOURCE_DIR ${FLASH_MLA_SRC_DIR})
else()
  FetchContent_Declare(flashmla GIT_REPOSITORY https://github.com/vllm-project/FlashMLA
                       GIT_TAG 46d64a8ebef03fa50b4ae74937276a5c940e3f95)
endif()
''',
}


def found(files: dict[str, str], **known: str) -> dict[str, cf.Declaration]:
    return {d.name: d for d in cf.discover(files.get, known).declarations}


def test_cpu_target_reads_the_included_file_and_stops_at_return() -> None:
    decls = found(VLLM_LIKE, VLLM_TARGET_DEVICE="cpu")
    assert list(decls) == ["arm_compute", "oneDNN"]  # FetchContent_Populate with details counts too
    one = decls["oneDNN"]
    assert (one.git_repository, one.git_tag) == ("https://github.com/uxlfoundation/oneDNN.git", "v3.13")
    assert one.when == ["(AVX512_FOUND AND NOT AVX512_DISABLED) OR (ASIMD_FOUND AND NOT APPLE_SILICON_FOUND)"
                        " OR POWER9_FOUND"]  # CPU features: not known statically, written down
    assert one.receive == one.src_dir_env == "FETCHCONTENT_SOURCE_DIR_ONEDNN"  # vLLM reads it from $ENV too
    assert one.file == "cmake/cpu_extension.cmake:14"
    assert decls["arm_compute"].git_tag == "v52.6.0" and "ASIMD_FOUND" in decls["arm_compute"].when


def test_cuda_target_keeps_undecided_conditions_and_the_projects_own_variable() -> None:
    decls = found(VLLM_LIKE, VLLM_TARGET_DEVICE="cuda")
    assert sorted(decls) == ["cutlass", "flashmla"]
    cutlass = decls["cutlass"]
    assert cutlass.git_tag == "v4.2.1"  # set() inside the same undecided branch is resolved
    assert cutlass.receive == "VLLM_CUTLASS_SRC_DIR"  # if(DEFINED ENV{...}) set(... $ENV{...})
    assert 'VLLM_GPU_LANG STREQUAL "CUDA"' in cutlass.when  # CUDA_FOUND is not known statically
    assert decls["flashmla"].git_tag == "46d64a8ebef03fa50b4ae74937276a5c940e3f95"
    assert decls["flashmla"].receive == "FETCHCONTENT_SOURCE_DIR_FLASHMLA"  # no $ENV for FLASH_MLA_SRC_DIR


def test_no_cmakelists_means_no_native_build() -> None:
    result = cf.discover({"setup.py": ""}.get)
    assert (result.cmake, result.declarations) == (False, [])


@pytest.mark.parametrize(("condition", "truth"), [
    ('X STREQUAL "a"', True), ('NOT X STREQUAL "a"', False), ('"X" STREQUAL "a"', False),
    ("X AND UNKNOWN", None), ("NOT X OR UNKNOWN", None), ("(X STREQUAL b) OR ON", True),
    ("DEFINED X", True), ("DEFINED ENV{HOME_X}", True), ("DEFINED ENV{NOPE}", False),
    ('V VERSION_GREATER_EQUAL "3.10"', True), ('V VERSION_LESS 3.9', False), ("N EQUAL 2", True),
    ('X MATCHES "^a$"', True), ("a IN_LIST L", True), ("z IN_LIST L", False), ("EXISTS /x", None),
    ("OFF", False), ("1", True), ("UNKNOWN", None), ("UNKNOWN-NOTFOUND", False),
])
def test_conditions(condition: str, truth: bool | None) -> None:
    scope = cf.Scope({"X": "a", "V": "3.12", "N": "2", "L": "a;b"}, {"HOME_X": "1"})
    args = cf.parse(f"if({condition})\n", "t")[0].args
    assert cf.Condition(scope, args).evaluate() is truth


def test_variables_set_in_branches_that_may_run_are_not_known_after_them() -> None:
    files = {"CMakeLists.txt": "if(MAYBE)\n set(T v2)\nelse()\n set(T v1)\nendif()\n"
                               "FetchContent_Declare(k GIT_REPOSITORY u GIT_TAG ${T})\n"}
    with pytest.raises(BadInput, match=r"CMakeLists.txt:6: FetchContent_Declare\(k GIT_TAG \$\{T\}\): not known"):
        cf.discover(files.get)
    files["CMakeLists.txt"] = "set(T v1)\nif(OFF)\n set(T v2)\nendif()\nFetchContent_Declare(k GIT_REPOSITORY u GIT_TAG ${T})\n"
    assert cf.discover(files.get).declarations[0].git_tag == "v1"


def test_module_include_through_cmake_module_path_and_add_subdirectory_not_followed() -> None:
    files = {
        "CMakeLists.txt": "list(APPEND CMAKE_MODULE_PATH ${CMAKE_CURRENT_LIST_DIR}/cmake)\ninclude(deps)\n"
                          "add_subdirectory(extra)\n",
        "cmake/deps.cmake": "FetchContent_Declare(dep GIT_REPOSITORY ../dep.git GIT_TAG v1)\n",
        "extra/CMakeLists.txt": "FetchContent_Declare(hidden GIT_REPOSITORY ../h.git GIT_TAG v1)\n",
    }
    result = cf.discover(files.get)
    assert [d.name for d in result.declarations] == ["dep"]
    assert result.files == ["CMakeLists.txt", "cmake/deps.cmake"]


def test_a_return_that_may_run_makes_the_rest_conditional() -> None:
    files = {"CMakeLists.txt": "if(SOMETHING)\n return()\nendif()\n"
                               "FetchContent_Declare(late GIT_REPOSITORY u GIT_TAG v)\n"}
    assert cf.discover(files.get).declarations[0].when == ["after a return() that may run"]


def test_bad_cmake_text_is_one_line_naming_the_file() -> None:
    with pytest.raises(BadInput, match=r"^CMakeLists.txt:2: unterminated if\("):
        cf.discover({"CMakeLists.txt": "project(x)\nif(A\n"}.get)
    with pytest.raises(BadInput, match=r"^CMakeLists.txt:1: if\(\) without endif\(\)"):
        cf.discover({"CMakeLists.txt": "if(A)\n"}.get)


def test_read_from_the_git_tree_at_a_commit(tmp_path: Path) -> None:
    repo = pygit2.init_repository(str(tmp_path / "r.git"), bare=True)
    tb = repo.TreeBuilder()
    tb.insert("CMakeLists.txt", repo.create_blob(VLLM_LIKE["CMakeLists.txt"].encode()), pygit2.GIT_FILEMODE_BLOB)
    sub = repo.TreeBuilder()
    for name in ("utils.cmake", "cpu_extension.cmake"):
        sub.insert(name, repo.create_blob(VLLM_LIKE[f"cmake/{name}"].encode()), pygit2.GIT_FILEMODE_BLOB)
    tb.insert("cmake", sub.write(), pygit2.GIT_FILEMODE_TREE)
    sig = pygit2.Signature("t", "t@example.invalid", 0, 0)
    commit = repo.create_commit(None, sig, sig, "m", tb.write(), [])
    result = cf.discover_at(repo, str(commit), {"VLLM_TARGET_DEVICE": "cpu"})
    assert [d.name for d in result.declarations] == ["arm_compute", "oneDNN"]


DIRECT = {  # vLLM's deepgemm.cmake pattern: a local tree through its own variable, else a direct Populate
    "CMakeLists.txt": r'''
cmake_minimum_required(VERSION 3.26)
project(p LANGUAGES CXX)
include(FetchContent)
if (DEFINED ENV{DEEPGEMM_SRC_DIR})
  set(DEEPGEMM_SRC_DIR $ENV{DEEPGEMM_SRC_DIR})
endif()
if(DEEPGEMM_SRC_DIR)
  set(_user_src "${DEEPGEMM_SRC_DIR}")
  set(DEEPGEMM_SRC_DIR "${_user_src}")
  set(deepgemm_SOURCE_DIR "${DEEPGEMM_SRC_DIR}")
else()
  set(_src "${CMAKE_BINARY_DIR}/_deps/deepgemm-src")
  if(EXISTS "${_src}/setup.py")
    set(deepgemm_SOURCE_DIR "${_src}")
  else()
    FetchContent_Populate(deepgemm SOURCE_DIR "${_src}"
      GIT_REPOSITORY "https://github.com/vllm-project/DeepGEMM.git" GIT_TAG "0820030756945b2daec208e8e8255268360f337d")
  endif()
endif()
FetchContent_Populate(bare SOURCE_DIR "${CMAKE_BINARY_DIR}/bare" GIT_REPOSITORY https://example.com/bare.git GIT_TAG v1)
''',
}


def test_a_direct_populate_is_received_through_the_projects_own_source_dir_variable() -> None:
    decls = found(DIRECT)
    deepgemm = decls["deepgemm"]
    assert deepgemm.direct and deepgemm.receive == "DEEPGEMM_SRC_DIR"  # not FETCHCONTENT_SOURCE_DIR_*: ignored there
    assert decls["bare"].direct and decls["bare"].src_dir_env == ""


def test_a_direct_populate_without_a_variable_of_its_own_is_refused_by_the_lock() -> None:
    from builder.core.options import Settings
    from builder.lock import native

    bare = found(DIRECT)["bare"]
    with pytest.raises(BadInput) as err:
        native.resolve_input(Settings.from_env({}), "vllm", "https://example.com/vllm.git", bare)
    message = str(err.value)
    assert "\n" not in message and "FetchContent_Populate(bare GIT_REPOSITORY" in message
    assert "ignores FETCHCONTENT_SOURCE_DIR_BARE" in message and "CMakeLists.txt:" in message
