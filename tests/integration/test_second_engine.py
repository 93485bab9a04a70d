"""Acceptance on another engine, and the same digests from a build on it: a second dockerd (its own data
root, exec root, pidfile, socket, no bridge; tests/engines.py) pulls the staged demo image by digest from
the local registry and runs the demo gates (not the performance gate's six runs: its pass and fail are tested on the
shared engine and through Slurm); then builds the same pins cold and gets the same digests."""
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import docker
import pytest

from builder.engine import client as engine
from builder.image import build, render
from builder.lock import record as lock_record
from demo.prepare import variant_pins
from tests.conftest import SETTINGS
from tests.defects import without_performance
from tests.engines import Engine
from tests.fixture_types import DemoImage, DockerClient

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=1500, env=dict(os.environ))


def test_demo_gates_run_on_the_second_engine(demo_image: DemoImage, staged_demo: str, second_engine: Engine,
                                             docker_client: DockerClient, tmp_path: Path) -> None:
    """Over 60 s under load (79 s in the last CI run): the second dockerd pulls the staged image (every layer, the
    torch one included) and runs the demo's gates there, each in a fresh container."""
    pins_path = variant_pins(tmp_path / "pins", edit=without_performance, pins_path=Path(demo_image[1].pins_path))
    built = demo_image[3]
    other = docker.DockerClient(base_url=second_engine.url, timeout=600)
    assert other.info()["ID"] != docker_client.info()["ID"]
    with pytest.raises(docker.errors.ImageNotFound):
        other.images.get(built.image_id)  # absent before
    proc = run_cli("accept", str(pins_path), "--engine", second_engine.url, "--image", staged_demo,
                   "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    statuses = {g["name"]: g["status"] for g in report["gates"]}
    assert report["verdict"] == "ACCEPTED" and statuses == {**{g: "pass" for g in report["required_gates"]},
                                                            "performance": "not_run"}, statuses
    pulled = report["acceptance"]["pulled"]
    assert pulled["ref"] == staged_demo and pulled["image_id"] == built.image_id == report["image_id"]
    assert pulled["engine"]["id"] == other.info()["ID"] != docker_client.info()["ID"]
    assert pulled["engine"]["url"] == second_engine.url and "gpus" in pulled["engine"]
    assert report["run_manifest"]["run"]["acceptance_engine"]["id"] == pulled["engine"]["id"]
    assert other.images.get(built.image_id).id == built.image_id  # present after
    assert other.containers.list(all=True) == []  # every gate container removed


def test_unreachable_engine_exits_3_and_missing_digest_exits_1(demo_image: DemoImage, staged_demo: str, tmp_path: Path) -> None:
    pins_path = demo_image[1].pins_path
    gone = run_cli("accept", pins_path, "--engine", f"unix://{tmp_path}/none.sock", "--image", staged_demo)
    assert gone.returncode == 3, gone.stderr[-2000:]
    assert "not reachable" in gone.stderr
    missing = staged_demo.partition("@")[0] + "@sha256:" + "0" * 64
    absent = run_cli("accept", pins_path, "--image", missing)
    assert absent.returncode == 1, absent.stderr[-2000:]
    assert f"{missing}: not in the registry" in absent.stderr


def test_second_engine_builds_the_same_pins_to_the_same_digests(demo_image: DemoImage, second_engine: Engine) -> None:
    """Over 60 s under load (62 s in the last CI run): a --nocache build on the second engine, which first pulls
    the base; the claim is that another engine's build gives the same digests."""
    pins, resolved, rendered, built = demo_image
    if not Path(rendered.context_path).exists():  # a build that ended drops its context: render it again, same bytes
        rendered = render.render(pins, lock_record.of(pins), resolved, SETTINGS)
    there = replace(SETTINGS, docker_host=second_engine.url)
    other = build.build(rendered, there, nocache=True, echo=False)  # pulls the base from 127.0.0.1:5000
    assert other.raw_image_id != built.raw_image_id  # the engines' own builds differ ...
    assert (other.image_id, other.manifest_digest) == (built.image_id, built.manifest_digest)  # ... ours do not
    found = engine.inspect_image(engine.connect(there), build.local_tag(rendered, there))
    assert found is not None and found["Id"] == built.image_id
