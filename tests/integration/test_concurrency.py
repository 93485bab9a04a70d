"""Concurrent runs on one engine and registry: the shared caches and the history under concurrent writers, and
a fleet of four nightly runs (`builder nightly A B C D --jobs 4 --publish`): two with equal pins (one image,
built once by whichever run comes first, promoted by both), one sharing two components with them whose third
is a planted defect (NOT ACCEPTED, never published), one with their components under another name and repository
(the same image: an image holds build inputs only, builder/image/identity.py; published under its own repository)."""
from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.core import files as fs
from builder.core.options import Settings
from builder.engine import client as engine
from builder.engine.registry import Registry, split_repository
from builder.nightly import fleet
from builder.nightly.history import History
from tests.conftest import SETTINGS
from tests.fixture_types import DockerClient

ROOT = Path(__file__).resolve().parents[2]


def _add_rows(args: tuple[str, int]) -> int:
    path, worker = args
    history = History(Path(path))
    for i in range(20):
        history.add(f"pins-{worker}", "2026-12-01T00:00:00Z", "ACCEPTED", f"sha256:{i}", None, {"vllm": "a"},
                    Path(f"/r/{worker}/{i}"), 0, False)
    return worker


def test_history_takes_concurrent_writers(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    History(path)
    with multiprocessing.get_context("fork").Pool(8) as pool:
        assert sorted(pool.map(_add_rows, [(str(path), w) for w in range(8)])) == list(range(8))
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 160
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def _write_same(args: tuple[str, int]) -> bool:
    dest, worker = args
    for _ in range(50):
        fs.write_atomic(Path(dest), (str(worker) * 100_000).encode())
        data = Path(dest).read_bytes()
        if len(data) != 100_000 or len(set(data)) != 1:
            return False
    return True


def test_atomic_writes_never_show_a_mix(tmp_path: Path) -> None:
    dest = tmp_path / "blob"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        assert all(pool.map(_write_same, [(str(dest), w) for w in range(4)]))
    assert [p.name for p in tmp_path.iterdir()] == ["blob"]


def test_sweep_removes_only_dead_writers_temporaries(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    stale = tmp_path / f".blob.{pid}.0123abcd.part"
    stale.write_text("half")
    stale_dir = tmp_path / f".work.{pid}.x1y2z3.part"
    stale_dir.mkdir()
    live = fs.part_path(tmp_path / "blob")
    live.write_text("being written")
    assert sorted(fs.sweep_parts(tmp_path)) == sorted([stale, stale_dir])
    assert live.exists() and not stale.exists()


def test_fleet_plans_one_run_id_and_directory_per_pins(tmp_path: Path) -> None:
    settings = Settings.from_env({"BUILDER_CACHE": str(tmp_path / "cache"), "BUILDER_RUN_ID": "night1"})
    paths = [tmp_path / "a.yaml", tmp_path / "b" / "a.yaml", tmp_path / "c.yaml"]
    jobs = fleet.plan(paths, tmp_path / "out", settings)
    assert [j.run_id for j in jobs] == ["night1-n1", "night1-n2", "night1-n3"]
    assert len({j.out for j in jobs}) == 3 and len({j.log for j in jobs}) == 3
    with pytest.raises(Exception, match="each pins file once"):
        fleet.plan([paths[0], paths[0]], None, settings)
    assert fleet.severest([0, 4, 1]) == 1 and fleet.severest([0, 3, 130]) == 130 and fleet.severest([0, 4]) == 4
    assert fleet.severest([]) == 0 and fleet.severest([0, 0]) == 0


def test_run_ids_are_checked() -> None:
    assert Settings.from_env({"BUILDER_RUN_ID": "a-1"}).run_id == "a-1"
    assert Settings.from_env({}).run_id == Settings.from_env({}).run_id  # one run per process
    other = subprocess.run([sys.executable, "-c", "from builder.core.options import Settings as S; print(S.from_env({}).run_id)"],
                           capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()
    assert other != Settings.from_env({}).run_id
    for bad in ("A", "a--b", "-a", "a-", "x" * 33, "a/b"):
        with pytest.raises(Exception, match="BUILDER_RUN_ID"):
            Settings.from_env({"BUILDER_RUN_ID": bad})


@pytest.mark.slow
@pytest.mark.docker
def test_four_nightly_runs_at_once(demo_pins: Path, docker_client: DockerClient, tmp_path: Path) -> None:
    """Over 60 s under load (102 s in the last CI run): four nightlies at once, each building its pins and running
    its gates; concurrency is the point, so they cannot be run one at a time."""
    from demo.prepare import variant_pins
    from tests.defects import without_performance

    space = f"127.0.0.1:5000/conc-{uuid.uuid4().hex[:8]}"
    names = {"a": f"conc-a-{space[-8:]}", "c": f"conc-c-{space[-8:]}", "d": f"conc-d-{space[-8:]}"}

    def pins_for(key: str, component: str | None = None, pr: int | None = None, lock: bool = False) -> Path:
        def edit(data: dict[str, Any]) -> None:
            data["name"] = names[key]
            data["image"] = {"repository": f"{space}/{key}", "tags": ["demo"]}
            data["nightly"] = {"regression_threshold": 0.0, "retention": 2}  # throughput is noisy with 4 at once
            without_performance(data)  # this test is about four runs at once, not about speed
            data["acceptance"]["required_gates"] = ["provenance", "rl_step"]  # the gates run; c fails rl_step
        return variant_pins(tmp_path / f"pins-{key}", component, pr, edit=edit, pins_path=demo_pins, lock=lock,
                            share_cache=True)  # one scope (the demo's): the builds of the four wait for each other

    a = pins_for("a")
    b = a.with_name("b.yaml")  # equal pins in another file: the same image, built once
    b.write_text(a.read_text())
    c = pins_for("c", "vllm", 13, lock=True)  # demo PR 13, a planted defect: shares megatron and verl with a and b
    d = pins_for("d")  # a's components under another name and repository
    run_id = f"conc{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, BUILDER_RUN_ID=run_id)
    proc = subprocess.run([sys.executable, "-m", "builder", "nightly", str(a), str(b), str(c), str(d), "--jobs", "4",
                           "--publish", "--out", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3000)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(SETTINGS.cache("logs", "nightly", run_id).glob("*.log")))
    assert proc.returncode == 1, proc.stderr[-3000:] + logs  # the fleet's: c is not accepted
    reports = {key: json.loads((tmp_path / "out" / f"{i}-{stem}" / "report.json").read_text())
               for key, i, stem in (("a", 1, a.stem), ("b", 2, b.stem), ("c", 3, c.stem), ("d", 4, d.stem))}
    assert {k: r["verdict"] for k, r in reports.items()} == {"a": "ACCEPTED", "b": "ACCEPTED", "c": "NOT ACCEPTED",
                                                             "d": "ACCEPTED"}
    assert {g["name"]: g["status"] for g in reports["c"]["gates"]}["rl_step"] == "fail"
    # an image holds the pins' build inputs only (builder/image/identity.py): d's other name and repository give
    # a's image; c's defect gives another
    assert reports["a"]["image_id"] == reports["b"]["image_id"] == reports["d"]["image_id"] != reports["c"]["image_id"]
    for key, report in reports.items():
        repo = f"{space}/{'a' if key == 'b' else key}"
        host, name = split_repository(repo)
        reg = Registry(host)
        assert report["repository"] == repo
        if key == "c":  # never published: no release tag exists
            assert report["publish"] is None and all(reg.tag_digest(name, t) is None for t in [*report["tags"], "nightly"])
        else:
            assert report["publish"]["digest"] == report["build"]["manifest_digest"]
            for tag in [*report["tags"], "nightly"]:
                assert reg.tag_digest(name, tag) == report["publish"]["digest"], (key, tag)
        local = f"builder-run/{run_id}-n{'abcd'.index(key) + 1}:{report['tags'][0]}"
        assert docker_client.images.get(local).id == report["image_id"]
        assert (tmp_path / "out" / f"{'abcd'.index(key) + 1}-{Path(report['sources']['pins_path']).stem}"
                / "nightly-diff.json").is_file()
    history = History(SETTINGS.cache("history") / "runs.sqlite")
    rows = [r for n in set(names.values()) for r in history.runs(n)]
    assert len(rows) == 4
    assert sorted((r.verdict, r.exit_code) for r in rows) == [("ACCEPTED", 0)] * 3 + [("NOT ACCEPTED", 1)]
    assert sorted(Path(r.report_path).parent.name for r in rows) == [f"{i}-{p.stem}" for i, p in enumerate((a, b, c, d), 1)]
    for key in "abcd":
        for image in docker_client.images.list(name=f"builder-run/{run_id}-n{'abcd'.index(key) + 1}"):
            for tag in image.tags:
                engine.untag(docker_client, tag)
    assert yaml.safe_load(a.read_text())["name"] == names["a"]
