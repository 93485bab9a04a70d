"""benchmarks/bench_nodes.py counts every part of the census in its cost a gate: each part the gate's evidence names
(the census thread, the census container's fanotify reader), on every node of the gate (each rank's census)."""
import sys
from pathlib import Path

from builder.core.evidence import Evidence

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # as mypy sees it (mypy_path)
from bench_nodes import GOAL_S, _cpu, census_parts  # noqa: E402


def test_every_part_on_every_node_is_counted() -> None:
    evidence = Evidence.model_validate({
        "census": {"cpu_s": 0.19, "cpu_parts": {"thread": 0.12, "fanotify": 0.07}},
        "ranks": [{"rank": 1, "node": "n2", "role": "rollout", "status": "pass", "reason": "",
                   "evidence": {"census": {"cpu_s": 0.05}}}]})  # an older suite on n2: the thread alone
    assert census_parts(evidence) == {"thread": 0.17, "fanotify": 0.07}
    summary = _cpu([census_parts(evidence), {"thread": 0.31}])
    assert summary["census_cpu_s"] == [0.24, 0.31] and summary["parts_median_s"] == {"fanotify": 0.035,
                                                                                      "thread": 0.24}
    assert summary["goal_s"] == GOAL_S and summary["met"] is False  # one gate over 0.3 s: not met
