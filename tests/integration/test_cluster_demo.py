"""The demo through --slurm on a real one-node cluster: the good demo image ACCEPTED from its .sqsh, and planted
defects caught by the same gate with the same reason as under Docker (tests/test_accept.py). One exported
.sqsh per image and one cluster for the session."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builder.accept import gates
from builder.cluster import accept as cluster_accept
from builder.core.constants import GATES
from builder.core.options import Settings
from builder.core.records import AcceptanceResult

SETTINGS = Settings.from_env()
pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return SETTINGS.cache("cluster-images")  # one .sqsh per image ID, reused across sessions when unchanged


def on_slurm(pins: Any, image_id: str, shared: Path, gate_names: list[str] | None = None) -> AcceptanceResult:
    opts = cluster_accept.options(pins, SETTINGS, {"shared_dir": str(shared)})
    return cluster_accept.accept_on_slurm(pins, image_id, SETTINGS, opts, gate_names, None)


def by_name(result: AcceptanceResult) -> dict[str, Any]:
    return {g.name: g for g in result.gates}


def test_good_demo_is_accepted_through_slurm(slurm_cluster: Any, demo_image: Any, shared_dir: Path) -> None:
    pins, _, _, built = demo_image
    result = on_slurm(pins, built.image_id, shared_dir)
    found = by_name(result)
    assert {n: g.status for n, g in found.items()} == {n: "pass" for n in GATES}, {n: g.reason for n, g in found.items()}
    c = result.container
    assert c["runner"] == "slurm" and c["runtime"] == "charliecloud" and c["sqsh_sha256_node"] == c["sqsh_sha256"]
    runs = [f for f in c["gates"].values() if "runs" not in f] + c["gates"]["performance"]["runs"]
    assert len(runs) == 4 + 6 and len({f["step"] for f in runs}) == 10  # a fresh container (step) per run
    assert all(f["state"] == "COMPLETED" and f["exit_code"] == "0:0" and f["job_id"] == c["job_id"] for f in runs)


@pytest.mark.parametrize("component, pr, gate, words", [
    ("vllm", 12, "zero_update", "expected exactly 0.0"),
    ("vllm", 13, "rl_step", "step 2:"),
    ("vllm", 14, "performance", "< min_ratio 0.2 "),
])
def test_planted_defect_fails_as_under_docker(slurm_cluster: Any, demo_image: Any, build_variant: Any,
                                              shared_dir: Path, component: str, pr: int, gate: str,
                                              words: str) -> None:
    pins = demo_image[0]
    image_id = build_variant(component, pr).image_id
    result = on_slurm(pins, image_id, shared_dir, [gate])
    got = by_name(result)[gate]
    assert got.status == "fail" and words in got.reason, got.reason
    docker = by_name(gates.accept(image_id, pins, SETTINGS, gates=[gate]))[gate]
    assert docker.status == "fail" and words in docker.reason  # the same gate and reason as under Docker
