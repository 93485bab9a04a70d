"""The report's native libraries per process (issue 47): each mapped library under its owning distribution, with
the distribution's lock line or "base image"; one that belongs to none is shown as such."""
from types import SimpleNamespace
from typing import Any, cast

from builder.report import document

SITE = "/opt/venv/lib/python3.11/site-packages"
PROCESSES = {"rl_step": [{"pid": 7, "libraries": {
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
