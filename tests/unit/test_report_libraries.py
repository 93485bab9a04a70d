"""The report's native libraries per process (issue 47): each mapped library under its owning distribution, with
the distribution's lock line or "base image"; one that belongs to none is shown as such."""
from types import SimpleNamespace
from typing import Any, cast

from builder.core.evidence import ProcessRow
from builder.report import document

SITE = "/opt/venv/lib/python3.11/site-packages"
PROCESSES: dict[str, list[ProcessRow]] = {"rl_step": [{"pid": 7, "libraries": {
    f"{SITE}/torch/lib/libtorch_cpu.so": "torch 2.11.0", f"{SITE}/torch/lib/libc10.so": "torch 2.11.0",
    f"{SITE}/numpy/core/_multiarray_umath.so": "numpy 2.3.0", "/usr/lib/x86_64-linux-gnu/libc.so.6": "base image",
    "/tmp/x/libfast.so": None}}]}


def test_lock_lines_and_the_table_name_each_owner() -> None:
    lock = SimpleNamespace(runtime="numpy==2.3.0 --hash=sha256:" + "a" * 64 + "  # numpy-2.3.0.whl\n",
                           native=SimpleNamespace(base_records={"torch": {}}))
    lines = document.lock_lines(PROCESSES, cast(Any, lock))
    assert lines == {"numpy": "numpy==2.3.0 --hash=sha256:" + "a" * 64, "torch": "base image"}
    report = SimpleNamespace(processes=PROCESSES, lock_lines=lines)
    table = "\n".join(document.libraries_markdown(cast(Any, report)))
    assert "| rl_step | 7 | torch 2.11.0 | 2: libc10.so, libtorch_cpu.so | base image |" in table, table
    assert "| rl_step | 7 | numpy 2.3.0 | 1: _multiarray_umath.so | numpy==2.3.0 --hash=sha256:" in table
    assert "| rl_step | 7 | none (fails) | 1: libfast.so | - |" in table


def test_a_named_runtime_library_gets_its_six_layers() -> None:
    comp = SimpleNamespace(distribution="tinyengine", commit="c" * 40)
    pins = SimpleNamespace(components=SimpleNamespace(vllm=comp, megatron=comp, verl=comp), runtime_libraries=[
        SimpleNamespace(distribution="torch", import_root="torch", built_into=None),
        SimpleNamespace(distribution="flash-attention", import_root=None, built_into="vllm")])
    lock = SimpleNamespace(runtime="", native=SimpleNamespace(base_records={"torch": {}}))
    processes: dict[str, list[ProcessRow]] = {**PROCESSES, "zero_update": [
        {"pid": 9, "libraries": {f"{SITE}/tinyengine/_C.so": "tinyengine 0.2"},
         "library_sha256": {f"{SITE}/tinyengine/_C.so": "e" * 64},
         "library_deps": {f"{SITE}/tinyengine/_C.so": {"needed": ["libtorch_cpu.so", "libcudart.so.13"],
                                                         "cuda_arches": ["sm_90", "sm_90a"]}}}]}
    manifest = {"site_packages": SITE, "distributions": {"torch": "2.11.0", "tinyengine": "0.2"}}
    torch, flash = document.runtime_libraries(cast(Any, pins), processes, cast(Any, lock), manifest, "sha256:" + "1" * 64)
    assert torch["source"] == "base image" and torch["installed"] == {"import_path": f"{SITE}/torch", "version": "2.11.0"}
    assert sorted(x["path"].rsplit("/", 1)[1] for x in torch["loaded"]) == ["libc10.so", "libtorch_cpu.so"]
    assert torch["run"] == ["rl_step pid 7"] and torch["image"] == "sha256:" + "1" * 64 and torch["jit"]
    assert flash["source"] == f"native input of vllm (built from commit {'c' * 40})"
    assert flash["loaded"] == [{"gate": "zero_update", "pid": 9, "path": f"{SITE}/tinyengine/_C.so", "sha256": "e" * 64,
                                "needed": ["libtorch_cpu.so", "libcudart.so.13"], "cuda_arches": ["sm_90", "sm_90a"]}]
    report = SimpleNamespace(runtime_libraries=[torch, flash])
    table = "\n".join(document.runtime_libraries_markdown(cast(Any, report)))
    assert "| torch | base image | " in table and "| flash-attention (in vllm) | native input of vllm" in table, table
    # the loaded libraries' dependencies beyond each other, and their CUDA targets; torch's rows were read by an
    # older suite (no library_deps): "not read", never an empty list
    assert "| 1: _C.so | libcudart.so.13, libtorch_cpu.so; CUDA: sm_90, sm_90a |" in table, table
    assert "| 2: libc10.so, libtorch_cpu.so | not read |" in table, table
