"""acceptance.procfs on this very process once torch is imported (slow: torch); moved out of
tests/unit/test_acceptance_unit.py, the unit lane."""
import pytest

from acceptance import procfs


@pytest.mark.slow  # imports torch
def test_mapped_libraries_of_this_process() -> None:
    import torch  # noqa: F401  (maps its native libraries)

    libs = procfs.mapped_libraries()
    assert any(p.endswith("libtorch_cpu.so") for p in libs)
    assert all(".so" in p for p in libs)
