"""`builder run` end to end on the demo stack: exit codes 0 / 1 / 2 / 3, publish only when accepted,
and a second run that reuses the build but accepts again in new containers."""
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from builder.core.options import Settings
from builder.engine.registry import Registry, split_repository
from builder.image.render import sha_tag
from builder.nightly.history import History
from builder.pins import model as pins_mod
from builder.pipeline import nightly_runs
from builder.report.document import image_tags
from demo.prepare import variant_pins
from tests.defects import without_performance
from tests.fixture_types import DockerClient

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200, env={**os.environ, **(env or {})})


@pytest.fixture
def untag() -> Iterator[list[str]]:
    """Image refs to untag after the test (never-accepted variants leave no tag behind)."""
    refs: list[str] = []
    yield refs
    from builder.engine import client as engine

    client = engine.connect(Settings.from_env())
    for ref in refs:
        engine.untag(client, ref)


def container_ids(report: dict[str, Any]) -> set[str]:
    """Every gate's container ID (the performance gate: one container per run)."""
    ids = set()
    for gate in report["acceptance"]["where"]["gates"].values():
        ids |= {gate["id"]} if "id" in gate else {run["id"] for run in gate.get("runs", [])}  # not run: none
    return ids


def served(repository: str, tag: str) -> int:
    host, name = split_repository(repository)
    return requests.head(f"http://{host}/v2/{name}/manifests/{tag}", timeout=10,
                         headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"}).status_code


def killed_in_publish(args: list[str], tags: list[str], repository: str) -> None:
    """`builder run ... --publish` SIGKILLed at a random moment of its publish step (docs/release.md): straight after,
    each tag serves its old digest or the new one and a moving tag the new one only when the SHA tag does."""
    host, name = split_repository(repository)
    reg = Registry(host)
    before = {t: reg.tag_digest(name, t) for t in tags}
    proc = subprocess.Popen([sys.executable, "-m", "builder.cli", *args], cwd=ROOT, text=True, env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("==> publish"):
            break
    time.sleep(random.uniform(0.0, 0.5))  # a publish without a key takes about a second
    proc.kill()
    proc.wait(timeout=60)
    report = json.loads((Path(args[args.index("--out") + 1]) / "report.json").read_text())
    new = report["build"]["manifest_digest"]
    after = {t: reg.tag_digest(name, t) for t in tags}
    assert all(after[t] in (before[t], new) for t in tags), (before, after, new)
    assert after[tags[0]] == new or all(after[t] != new or before[t] == new for t in tags[1:]), (before, after)


def test_run_accepts_publishes_and_reruns(demo_pins: Path, tmp_path: Path) -> None:
    """The first run is SIGKILLed in its publish step; `builder publish` of its report finishes the release.
    Over 60 s under load (101 s in the last CI run): two `builder run`s, each building, gating and publishing,
    and a `builder publish` between them."""
    pins_path = variant_pins(tmp_path / "pins", edit=without_performance, pins_path=demo_pins)  # about runs, not speed
    pins = pins_mod.load(pins_path)
    killed_in_publish(["run", str(pins_path), "--publish", "--out", str(tmp_path / "a")], image_tags(pins),
                      pins.image.repository)
    first = run_cli("publish", str(tmp_path / "a" / "report.json"))
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["verdict"] == "ACCEPTED"
    receipt = report["publish"]
    assert receipt["verified"] and receipt["config_digest"] == report["build"]["image_id"]
    host, name = split_repository(receipt["repository"])
    served_digest = Registry(host).manifest(name, report["tags"][0])["computed"]
    assert served_digest == receipt["digest"]
    assert len([ln for ln in first.stderr.splitlines() if "that a killed run began" in ln]) <= 1

    second = run_cli("run", str(pins_path), "--out", str(tmp_path / "b"))
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads((tmp_path / "b" / "report.json").read_text())
    assert again["build"]["image_id"] == report["build"]["image_id"]
    assert again["build"]["cached"] is True
    assert container_ids(again).isdisjoint(container_ids(report))  # fresh containers
    assert again["publish"] is None  # not asked this time


def test_run_not_accepted_exits_1_and_publishes_nothing(demo_pins: Path, tmp_path: Path, untag: list[str]) -> None:
    pins_path = variant_pins(tmp_path / "pins", "vllm", 12, edit=without_performance, pins_path=demo_pins,
                             lock=True)  # batch invariance broken
    out = run_cli("run", str(pins_path), "--publish", "--out", str(tmp_path / "run"))
    assert out.returncode == 1, out.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["verdict"] == "NOT ACCEPTED" and report["publish"] is None
    assert {g["name"]: g["status"] for g in report["gates"]}["zero_update"] == "fail"
    from builder.pins import model as pins_mod

    pins = pins_mod.load(pins_path)
    untag.append(f"{pins.image.repository}:{sha_tag(pins)}")
    assert served(pins.image.repository, sha_tag(pins)) == 404
    # the run by hand is in the history (so the first `builder history` after `make demo` shows it), marked so
    settings = Settings.from_env()
    history = History(settings.cache("history") / "runs.sqlite")
    row = next(r for r in history.runs(pins.name) if r.report_path == str(tmp_path / "run" / "report.json"))
    assert (row.kind, row.verdict, row.exit_code) == ("hand", "NOT ACCEPTED", 1)
    page_text = nightly_runs.history_page(settings, names=[pins.name], out=tmp_path / "page.html",
                                      history=history).read_text()
    assert f'id="night-{row.id}"' in page_text and 'data-kind="hand"' in page_text


def test_run_bad_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "pins.yaml"
    bad.write_text("- a list\n- not a mapping\n")
    out = run_cli("run", str(bad), "--out", str(tmp_path / "run"))
    assert out.returncode == 2 and str(bad) in out.stderr
    assert not (tmp_path / "run").exists()  # nothing half-made


def test_run_engine_unreachable_exits_3(demo_pins: Path, tmp_path: Path) -> None:
    out = run_cli("run", str(demo_pins), "--out", str(tmp_path / "run"),
                  env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert out.returncode == 3, out.stderr[-2000:]
    assert "docker engine" in out.stderr
    assert not (tmp_path / "run").exists()


def test_sigint_during_a_gate_removes_its_container(demo_pins: Path, tmp_path: Path, docker_client: DockerClient,
                                                    untag: list[str]) -> None:
    """A real Ctrl-C (SIGINT) to `builder accept` while a gate runs: exit 130, no container left."""
    import signal
    import time

    def long_run(data: dict[str, Any]) -> None:  # a recipe that runs far longer than the test waits
        data["acceptance"]["steps"] = 100000
        data["recipe"]["overrides"][data["acceptance"].get("steps_key", "trainer.total_training_steps")] = 100000

    pins_path = variant_pins(tmp_path / "pins", edit=long_run, pins_path=demo_pins)
    # a run ID of its own: the variant differs in acceptance and recipe only, so its image is the demo image
    # (builder/image/identity.py), whose other names (release tags, other runs') are not this test's to remove
    run_id = f"sigint-{random.getrandbits(48):012x}"
    image = run_cli("build", str(pins_path), "--quiet", env={"BUILDER_RUN_ID": run_id})
    assert image.returncode == 0, image.stderr[-2000:]
    image_id = json.loads(image.stdout)["image_id"]
    untag.extend(t for t in json.loads(image.stdout)["tags"] if t.startswith(f"builder-run/{run_id}:"))
    proc = subprocess.Popen([sys.executable, "-m", "builder.cli", "accept", str(pins_path), "--image", image_id,
                             "--gate", "zero_update", "--out", str(tmp_path / "run")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # SIGINT at its default in the child: a job started in the background (nohup,
                            # `cmd &` in a script) inherits it ignored, and Python then installs no handler
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    label = {"label": "io.truepolicy.acceptance", "ancestor": image_id}
    deadline = time.monotonic() + 120
    while not docker_client.containers.list(filters=label) and time.monotonic() < deadline:
        time.sleep(0.5)
    running = docker_client.containers.list(filters=label)
    assert running, "the gate's container never started"
    time.sleep(3)  # the recipe is under way
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the builder's own cleanup removes the container
        proc.communicate(timeout=120)
        raise
    assert proc.returncode == 130, err[-2000:]
    assert docker_client.containers.list(all=True, filters=label) == []
    assert not (tmp_path / "run" / "report.json").exists()
