"""The sequential performance gate on real images: a 1.2x slower exact path (demo vllm PR 16, a decode self-check)
still passes; beside a bounded load of CPU, memory copies and disk writes, that benign change is never failed.
(The slow PR 14 under the same load was checked once, 2026-12-04: fail or inconclusive, never pass; it is not a
test here for the budget: its slow runs under load took 100 s. tests/unit/test_performance.py decides the loaded
runs quoted in issue 49, and test_accept.py fails PR 14 on a quiet machine.)"""
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.core.options import Settings
from builder.runners import factory as runners
from tests.defects import SLIGHTLY_SLOWER_PATH
from tests.fixture_types import BuildVariant, DemoImage

pytestmark = pytest.mark.docker
SETTINGS = Settings.from_env()
LOAD_S = 400  # the load ends by itself after this, whatever the test does (teardown kills it first)

# three loads, each one process: a busy loop, 256 MB buffers copied again and again, 32 MB files written and synced
LOADS = {
    "cpu": "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n",
    "memory": "import time\nend = time.time() + {s}\na = bytearray(256 << 20)\n"
              "while time.time() < end: b = bytes(a); a[:] = b\n",
    "disk": "import os, time\nend = time.time() + {s}\nblock = os.urandom(1 << 20)\n"
            "while time.time() < end:\n    with open({path!r}, 'wb') as f:\n"
            "        for _ in range(32): f.write(block)\n        f.flush(); os.fsync(f.fileno())\n",
}


@pytest.fixture
def load(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", code.format(s=LOAD_S, path=str(tmp_path / "load.bin"))])
             for code in LOADS.values()]
    time.sleep(1)  # the buffers are allocated, the loops running
    assert all(p.poll() is None for p in procs)
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_a_1_2x_slower_exact_path_passes(demo_image: DemoImage, build_variant: BuildVariant, run_id: str) -> None:
    """PR 16 runs each decode step's MLP twice (about 1.2x the rollout's CPU time): the pairs' ratio stays far
    above min_ratio 0.2, so the gate passes, and it stops as soon as the bounds decide. Over 60 s on a loaded host
    (130 s once): it builds the PR 16 variant (the engine stage and all after it), which the load test reuses."""
    result = runners.gate_local_image(build_variant(*SLIGHTLY_SLOWER_PATH).image_id, demo_image[0], SETTINGS,
                                      gates=["performance"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "performance")
    assert gate.status == "pass", gate.reason
    assert gate.evidence.pairs is not None and gate.evidence.stopped == f"decided after {gate.evidence.pairs} pairs"
    assert len(gate.evidence.runs or []) == 2 * gate.evidence.pairs and "the lower bound is >= min_ratio 0.2" in gate.reason


def test_load_never_fails_the_benign_change(demo_image: DemoImage, build_variant: BuildVariant, run_id: str,
                                            load: list[subprocess.Popen[bytes]]) -> None:
    """Beside a busy loop, 256 MB memory copies and synced disk writes (bounded: LOAD_S), the benign change (PR 16,
    built by the test above) ends pass or inconclusive: load costs pairs, never a wrong verdict. At most 3 pairs
    (the demo allows 4) to bound its time: under the load a run takes 5 to 10 s, so up to 60 s and more on a busy
    host (77 s once with 4 pairs at 100% CPU)."""
    pins = demo_image[0]
    perf = pins.acceptance.performance
    assert perf is not None
    pins = pins.model_copy(update={"acceptance": pins.acceptance.model_copy(update={
        "performance": perf.model_copy(update={"repeats": 3})})})
    image = build_variant(*SLIGHTLY_SLOWER_PATH).image_id
    result = runners.gate_local_image(image, pins, SETTINGS, gates=["performance"], run_id=run_id)
    gate = next(g for g in result.gates if g.name == "performance")
    assert all(p.poll() is None for p in load), "the load ended before the gate did"
    assert gate.status in ("pass", "inconclusive"), gate.reason
    if gate.status == "inconclusive":
        assert gate.evidence.stopped == "maximum of pairs reached" and "spread" in gate.reason
