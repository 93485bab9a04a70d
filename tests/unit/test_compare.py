"""`builder compare A B` on demo nights (tests/history_nights.py): the moved commit, the changed lock lines and
layers (digest and size, from OCI manifests in the blob store), the gate evidence that moved, the throughput
judged against the performance gate's noise; `last-accepted` from the history; bad input in one line."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import Report
from builder.engine import normalize
from builder.lock import record as lock_record
from builder.nightly import compare
from builder.nightly.history import History
from builder.pipeline import nightly_runs
from builder.report import document
from tests.fixture_types import MakeReportInputs
from tests.history_nights import demo_plans, write_nights

ROOT = Path(__file__).resolve().parents[2]
GOOD, SLOW, DEFECT, FIXED = ("a1" * 20, "b2" * 20, "c3" * 20, "d4" * 20)
BASE_LAYER = {"mediaType": normalize.LAYER_TYPE, "size": 30_000_000, "digest": "sha256:" + "0b" * 32}


def _manifest(settings: Settings, top: str, size: int) -> str:
    """An OCI manifest in the blob store: the base layer, then one added layer; its digest."""
    layers = [BASE_LAYER, {"mediaType": normalize.LAYER_TYPE, "size": size, "digest": "sha256:" + top * 32}]
    data = json.dumps({"schemaVersion": 2, "layers": layers}).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    normalize.blob_path(settings, digest).write_bytes(data)
    return digest


@pytest.fixture
def nights(report_inputs: MakeReportInputs, settings: Settings, tmp_path: Path) -> tuple[Settings, History, list[Path]]:
    local = replace(settings, cache_root=tmp_path / "cache")
    pins, sources, built, result = report_inputs()
    base = document.make_report(pins, lock_record.of(pins), sources, built, result)
    good, slow = _manifest(local, "1a", 4_000_000), _manifest(local, "2b", 4_500_000)
    plans = [replace(p, manifest=slow if p.vllm == SLOW else good) for p in demo_plans(GOOD, SLOW, DEFECT, FIXED)]
    history = History(tmp_path / "history" / "runs.sqlite")
    return local, history, write_nights(base, plans, tmp_path / "runs", history)


def _load(path: Path) -> Report:
    return document.load(path)


def test_the_slow_night_names_the_moved_commit_the_layers_and_the_noise(nights: tuple[Settings, History, list[Path]]) -> None:
    local, _, paths = nights
    diff = compare.compare(_load(paths[1]), _load(paths[2]), paths[1], paths[2], local)
    assert [(c["component"], c["old"], c["new"]) for c in diff["commits"] if c["moved"]] == [("vllm", GOOD, SLOW)]
    changed = [r for r in diff["layers"]["rows"] if r["changed"]]
    assert [(r["index"], r["old"]["size"], r["new"]["size"]) for r in changed] == [(1, 4_000_000, 4_500_000)]
    perf = next(e for e in diff["evidence"] if e["gate"] == "performance")
    assert {i["what"] for i in perf["items"] if i["moved"]} == {"status", "aligned median", "ratio"}
    assert diff["noise"]["verdict"] == "outside" and "do not overlap" in diff["noise"]["reason"]
    text = compare.to_markdown(diff)
    assert SLOW[:12] in text and "sha256:2b2b2b2b2b2b" in text and "4.5 MB" in text and "| 1 |" in text


def test_two_good_nights_differ_in_nothing_within_the_noise(nights: tuple[Settings, History, list[Path]]) -> None:
    local, _, paths = nights
    diff = compare.compare(_load(paths[0]), _load(paths[1]), paths[0], paths[1], local)
    assert not any(c["moved"] for c in diff["commits"]) and diff["layers"]["changed"] == 0
    assert not any(e["moved"] for e in diff["evidence"]) and diff["noise"]["verdict"] == "within"
    assert diff["summary"].startswith("commits moved: none; lock unchanged; layers changed: 0")


def test_changed_lock_lines_from_the_copy_beside_each_report(nights: tuple[Settings, History, list[Path]]) -> None:
    local, _, paths = nights
    old = _load(paths[0])
    text = (ROOT / "pins" / "locks" / "demo.lock").read_text()
    (paths[0].parent / compare.LOCK_COPY).write_text(text)
    line = next(x for x in text.splitlines() if x.startswith("ninja=="))
    moved = text.replace(line, line.replace("ninja==1", "ninja==9"))
    (paths[2].parent / compare.LOCK_COPY).write_text(moved)
    new = _load(paths[2]).model_copy(update={"lock_sha256": hashlib.sha256(moved.encode()).hexdigest()})
    assert old.lock_sha256 == hashlib.sha256(text.encode()).hexdigest()
    lock = compare.compare(old, new, paths[0], paths[2], local)["lock"]
    assert lock["changed"] and lock["removed"] == [line] and lock["added"] == [line.replace("ninja==1", "ninja==9")]
    gone = compare.compare(old, new, paths[0], paths[3], local)["lock"]  # no copy beside night 4
    assert gone["removed"] == [] and "lines unknown" in gone["note"]


def test_last_accepted_is_the_newest_accepted_night_before(nights: tuple[Settings, History, list[Path]]) -> None:
    local, history, paths = nights
    text = nightly_runs.compare(compare.LAST_ACCEPTED, str(paths[5]), local, fmt="json", history=history)
    assert json.loads(text)["old"]["path"] == str(paths[1])  # nights 3 to 5 were not accepted
    page = nightly_runs.compare(str(paths[5]), compare.LAST_ACCEPTED, local, fmt="html", history=history)
    assert page.startswith("<!DOCTYPE html>") and str(paths[1]) in page and "<script" not in page
    with pytest.raises(BadInput, match="last-accepted: no accepted nightly run"):
        nightly_runs.compare(compare.LAST_ACCEPTED, str(paths[0]), local, history=history)
    with pytest.raises(BadInput, match="at most one side"):
        nightly_runs.compare(compare.LAST_ACCEPTED, compare.LAST_ACCEPTED, local, history=history)
    with pytest.raises(BadInput, match="--format"):
        nightly_runs.compare(str(paths[0]), str(paths[1]), local, fmt="pdf", history=history)


def test_layers_unknown_when_the_manifest_blob_is_gone(nights: tuple[Settings, History, list[Path]]) -> None:
    local, _, paths = nights
    old = _load(paths[0])
    assert old.build is not None
    normalize.blob_path(local, old.build.manifest_digest).unlink()
    layers = compare.compare(old, _load(paths[2]), paths[0], paths[2], local)["layers"]
    assert not layers["known"] and f"no OCI manifest {old.build.manifest_digest} in the blob store" in layers["note"]


def test_the_command_prints_markdown_and_refuses_a_missing_report(nights: tuple[Settings, History, list[Path]],
                                                                  tmp_path: Path) -> None:
    _, _, paths = nights
    env = {**os.environ, "BUILDER_CACHE": str(tmp_path / "cli-cache")}
    done = subprocess.run([sys.executable, "-m", "builder", "compare", str(paths[1]), str(paths[2])],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "| vllm | #11 -> #14 |" in done.stdout and "**yes**" in done.stdout
    missing = subprocess.run([sys.executable, "-m", "builder", "compare", str(tmp_path / "none.json"), str(paths[2])],
                             capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "none.json" in missing.stderr
