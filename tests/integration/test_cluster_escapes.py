"""A planted escape under --slurm, as under Docker (tests/integration/test_accept_processes.py): it fails its gate with
the census naming the node, pid, executable and argv of the process that left no record.

One escape here (a worker without its recording variables): what Slurm adds is the census per node, the same code for
every escape. The three escapes (tests/defects.py ESCAPES: also one started with `python -S`, one that deletes its
record) each run under Docker; each one here would cost a variant's `.sqsh` export (30-100 s) for no other line."""
from __future__ import annotations

from pathlib import Path

import pytest

from builder.engine import client as engine
from builder.gating import plan
from builder.pins import model as pins_mod
from builder.runners import factory
from demo import cluster
from tests.conftest import SETTINGS
from tests.defects import ESCAPE_WITHOUT_VARIABLES, REASONS
from tests.fixture_types import BuildVariant, DemoImage
from tests.integration.test_accept_processes import _escape

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]


@pytest.mark.parametrize("defect", [ESCAPE_WITHOUT_VARIABLES], ids=lambda d: f"{d[0]}-{d[1]}")
def test_an_escape_fails_its_gate_under_slurm_with_the_process_named(
        slurm_cluster: cluster.Cluster, demo_image: DemoImage, build_variant: BuildVariant,
        cluster_images: tuple[object, Path], defect: tuple[str, int]) -> None:
    data = demo_image[0].to_json_dict()
    data["acceptance"]["slurm"] = {"shared_dir": str(cluster_images[1])}
    pins = pins_mod.validate(data, demo_image[0].directory)
    gate_name = REASONS[defect][0]
    made = plan.make(pins, plan.Flags(slurm=True, gates=[gate_name]), SETTINGS).acceptance
    result = factory.gate_image(made, pins, build_variant(*defect).image_id, None, SETTINGS, engine.connect(SETTINGS))
    assert result.where.runner == "slurm"
    row = _escape(next(g for g in result.gates if g.name == gate_name), defect)
    assert row["pid"] and row["exe"]
