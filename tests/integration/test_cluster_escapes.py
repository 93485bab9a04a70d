"""Issue 47's four classes under --slurm on two nodes, as under Docker (tests/integration/test_accept_processes.py):
tinyrl PR 50 starts, beside the rollout engine, the base interpreter through the dynamic loader (class 1), a process
that turns PR_SET_DUMPABLE off (class 2), a preexec_fn child that execs python -S after the fork handler's record
(class 3) and a 40 ms probe that imports tinyrl (class 4, past the census's floor). With acceptance.nodes 2 the
engine is the rollout server on n2, so its rank's census names them on that node, and the gate fails.

Class 2 here: the demo cluster's jobs run as root, and ch-run maps root to root in its user namespace with every
capability (CapEff 1ffffffffff in a ch-run started by hand), so the census usually reads the key holder after its
prctl and judges it by content: it recorded itself, so it is accounted, not named (5 runs of 7 on 2026-12-04; in the
other 2 its exe read EACCES and it failed closed, named). Either way the test requires the census's verdict to be
the right one for what it could read; a job run as a user has no capability there and always fails closed.

One variant, one `.sqsh` export and one Slurm gate (each costs 30-50 s): the other escapes (tests/defects.py ESCAPES,
CONTENT_ESCAPES) run under Docker; what Slurm adds is the census per node and ch-run's rules, the same code for each."""
from __future__ import annotations

from pathlib import Path

import pytest

from builder.engine import client as engine
from builder.gating import plan
from builder.pins import model as pins_mod
from builder.runners import factory
from demo import cluster
from tests.conftest import SETTINGS
from tests.defects import ESCAPES_AT_ONCE, REASONS
from tests.fixture_types import BuildVariant, DemoImage
from tests.integration.test_accept_processes import helpers_named

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]


def test_four_escapes_fail_their_gate_under_slurm_each_named_on_its_node(
        slurm_cluster: cluster.Cluster, demo_image: DemoImage, build_variant: BuildVariant,
        cluster_images: tuple[object, Path]) -> None:
    data = demo_image[0].to_json_dict()
    data["acceptance"]["slurm"] = {"shared_dir": str(cluster_images[1])}
    data["acceptance"]["nodes"] = 2
    pins = pins_mod.validate(data, demo_image[0].directory)
    gate_name = REASONS[ESCAPES_AT_ONCE][0]
    made = plan.make(pins, plan.Flags(slurm=True, gates=[gate_name]), SETTINGS).acceptance
    result = factory.gate_image(made, pins, build_variant(*ESCAPES_AT_ONCE).image_id, None, SETTINGS,
                                engine.connect(SETTINGS))
    assert result.where.runner == "slurm"
    gate = next(g for g in result.gates if g.name == gate_name)
    assert gate.status == "fail", gate.reason
    rollout = next(r for r in gate.evidence.ranks or [] if r.get("role") == "rollout")
    node = str(rollout["node"])
    assert gate.reason.startswith(f"node {node} (rank 1): per-process provenance: census: node {node} process "), \
        gate.reason
    census = gate.evidence.model_dump(mode="json")["census"]
    helpers_named(census, node, list((rollout.get("evidence") or {}).get("process_failures") or []),
                  may_read=("key-holder",))
    trainer = str(gate.evidence.node)
    assert trainer != node and census["nodes"][trainer]["unrecorded"] == []  # the trainer's node: nothing escaped
    print(gate.reason)
