"""`builder nightly A B C D --slurm` on the session's one-node cluster (conftest: slurm_fleet): every run builds
here and submits its gates to Slurm at once; the cluster runs as many allocations as its cores allow (one core
each) and the rest wait in its queue. A is the good demo, B, C and D planted defects; each under a name of
its own."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from builder.core.options import Settings
from builder.core.records import SlurmFacts
from builder.nightly.history import History
from builder.report import document

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]
SETTINGS = Settings.from_env()


def test_nightly_fleet_submits_every_run_to_slurm(slurm_fleet: dict[str, Any],
                                                  cluster_images: tuple[Settings, Path]) -> None:
    proc, runs = slurm_fleet["proc"], slurm_fleet["runs"]
    logs = "\n".join(p.read_text()[-3000:] for p in
                     sorted(SETTINGS.cache("logs", "nightly", slurm_fleet["run_id"]).glob("*.log")))
    assert proc.returncode == 1, proc.stderr[-3000:] + logs  # the fleet's: B, C and D are not accepted
    reports = {k: document.load(d / "report.json") for k, d in runs.items()}
    assert {k: r.verdict for k, r in reports.items()} == {"a": "ACCEPTED", "b": "NOT ACCEPTED", "c": "NOT ACCEPTED",
                                                          "d": "NOT ACCEPTED"}
    facts = {k: r.acceptance.where for k, r in reports.items()
             if r.acceptance is not None and isinstance(r.acceptance.where, SlurmFacts)}
    assert len(facts) == 4 and all(f.runner == "slurm" and f.sqsh is not None for f in facts.values())
    assert len({f.job_id for f in facts.values()}) == 4  # each run its own Slurm job
    assert all(Path(f.sqsh.path).parent == cluster_images[1] for f in facts.values() if f.sqsh)
    assert len({f.sqsh.path for f in facts.values() if f.sqsh}) == 4  # four images, four exports
    history = History(SETTINGS.cache("history") / "runs.sqlite")
    rows = [r for n in slurm_fleet["names"].values() for r in history.runs(n)]
    assert len(rows) == 4
    assert sorted((r.verdict, r.exit_code) for r in rows) == [("ACCEPTED", 0)] + [("NOT ACCEPTED", 1)] * 3
    assert sorted(Path(r.report_path).parent for r in rows) == sorted(runs.values())
