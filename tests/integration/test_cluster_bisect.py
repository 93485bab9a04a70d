"""`builder nightly --bisect --slurm` on the two-node demo cluster, end to end: the last accepted night ran tinyrl
PR 42 at s4; tonight's pins run its head s6 and zero_update flips from pass to fail; the bisection runs under
--slurm over the short series s5..s6 (each step's zero_update a Slurm step on the candidate's .sqsh) and names
s5, the planted defect, exactly; the history page's row for tonight links the first bad commit to the bisect
report, and the webhook message (a receiver on 127.0.0.1) names it. Nothing bisect built is left tagged, no .sqsh
it exported is left.

The last accepted night is written into the history, not run (a real report record from conftest report_inputs
with the demo's commits and verl at s4, as tests/history_nights.py derives nights): the bisection checks GOOD by
building and gating it like any step; BAD is the night's own run (not built again). Over 60 s (75 to 105 s here,
168 s under this host's heaviest load): the night's build, .sqsh and Slurm gate, then two bisect
builds, .sqsh exports and Slurm gates (GOOD, s5) are the fewest that show a search under Slurm from a nightly."""
from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.core.options import Settings
from builder.engine import client as engine
from builder.lock import record as lock_record
from builder.nightly import page
from builder.nightly.history import History
from builder.report import document
from demo import cluster
from demo.prepare import variant_pins
from tests.fixture_types import MakeReportInputs
from tests.history_nights import webhook
from tests.integration.test_bisect import ROOT, series
from tests.shared import local_tags

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]


def last_accepted_night(report_inputs: MakeReportInputs, pins: Path, commits: dict[str, str], name: str,
                        run_dir: Path, settings: Settings) -> None:
    """A night of `name` in the history: ACCEPTED, every gate passing, at these commits, of these pins."""
    made = report_inputs()
    base = document.make_report(made[0], lock_record.of(made[0]), *made[1:])
    comps = {n: c.model_copy(update={"commit": commits[n], "pr_head": commits[n]})
             for n, c in base.sources.components.items()}
    report = base.model_copy(update={"name": name, "sources": base.sources.model_copy(
        update={"pins_path": str(pins), "components": comps})})
    document.write(report, run_dir)
    History(settings.cache("history") / "runs.sqlite").add(
        name, "2026-12-01T03:00:00Z", "ACCEPTED", report.image_id, None, commits, run_dir / "report.json", 0, False,
        kind="nightly")


def test_nightly_bisect_under_slurm_names_the_planted_commit_on_the_page_and_in_the_message(
        slurm_cluster: cluster.Cluster, demo_pins: Path, cluster_images: tuple[object, Path],
        report_inputs: MakeReportInputs, settings: Settings, tmp_path: Path) -> None:
    uid = secrets.token_hex(4)
    name = f"bisect-night-{uid}"

    def edit(data: dict[str, Any]) -> None:
        data["name"] = name
        data["image"] = {"repository": f"127.0.0.1:5000/test/bisect-{uid}", "tags": ["demo"]}
        data["nightly"] = {"regression_threshold": 0.9, "retention": 1}
        data["acceptance"]["required_gates"] = ["zero_update"]  # the gate the defect fails (the others: Docker's)
        data["acceptance"].pop("performance", None)

    pins = variant_pins(tmp_path / "pins", "verl", 42, edit=edit, pins_path=demo_pins, share_cache=True)
    s = series(pins)
    commits = {n: str(c["commit"]) for n, c in yaml.safe_load(pins.read_text())["components"].items()}
    last_accepted_night(report_inputs, pins, {**commits, "verl": s["s4"]}, name, tmp_path / "night-1", settings)
    shared = cluster_images[1]
    sqsh_before = set(shared.glob("*.sqsh"))
    night = tmp_path / "night-2"
    with webhook() as hook:
        done = subprocess.run([sys.executable, "-m", "builder.cli", "nightly", str(pins), "--slurm", "--bisect",
                               "--out", str(night)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, BUILDER_SLURM_SHARED_DIR=str(shared), BUILDER_NOTIFY_URL=hook.url))
    assert done.returncode == 1, done.stderr[-3000:]  # NOT ACCEPTED stands: the bisection only names the commit
    answer = json.loads((night / page.BISECT / "bisect.json").read_text())
    assert answer["first_bad"]["commit"] == s["s5"] and answer["first_bad"]["gate"] == "zero_update"
    assert answer["first_bad"]["component"] == "verl" and answer["last_good"]["commit"] == s["s4"]
    assert [st["why"] for st in answer["steps"]] == ["BAD", "GOOD", "verl 1/2"]  # ceil(log2 2) + GOOD and BAD
    assert answer["steps"][0]["run_dir"] == str(night)  # BAD is the night's own run, not built again
    print({st["why"]: (round(st["build_s"], 1), round(st["gate_s"], 1)) for st in answer["steps"]})
    assert answer["builds"] <= answer["bound"] == 3
    ran = {json.loads((Path(st["run_dir"]) / "report.json").read_text())["acceptance"]["where"]["runner"]
           for st in answer["steps"]}
    assert ran == {"slurm"}

    text = (night / page.PAGE).read_text()
    rows = dict(re.findall(r'<tr id="night-(\d+)"(.*?)</tr>', text, re.S))
    mine = [r for r in rows.values() if f"first bad: verl {s['s5'][:10]} (zero_update)" in r]
    assert len(mine) == 1 and str(night / page.BISECT / "bisect.md") in mine[0]
    assert len(hook.received) == 1, done.stderr[-2000:]
    fields = {f["title"]: f["value"] for f in hook.received[0]["attachments"][0]["fields"]}
    assert fields["first bad commit"].startswith(f"verl {s['s5'][:12]} (PR #42)")

    client = engine.connect(Settings.from_env())
    state = json.loads((night / page.BISECT / "bisect-state.json").read_text())
    assert state["run_id"].endswith("-bisect")  # a run id of its own: its local names are not the night's
    assert not [t for t in local_tags(client) if state["run_id"] in t]
    own = json.loads((night / "report.json").read_text())["acceptance"]["where"]["sqsh"]["path"]
    assert set(shared.glob("*.sqsh")) - sqsh_before <= {Path(own)}  # the night's own .sqsh only, none of bisect's
    for suffix in ("", ".json", ".sha256"):
        Path(own + suffix).unlink(missing_ok=True)
