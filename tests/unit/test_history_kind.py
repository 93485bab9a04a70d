"""The history records every run with its kind: a database from before the column gains it by a migration (its
rows are nightly runs), runs by hand are rows the page marks, never the nightly's baseline (follow, compare's
last-accepted), and `builder gc` keeps the newest accepted nightly run however many runs by hand came after."""
from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from builder.bisect import sides
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import Report
from builder.lock import record as lock_record
from builder.nightly import compare, gc, page
from builder.nightly import history as history_mod
from builder.nightly.history import SCHEMA, History
from builder.report import document
from tests.fixture_types import MakeReportInputs

OLD_ROW = ("INSERT INTO runs (pins_name, started, verdict, image_id, digest, commits, report_path, exit_code,"
           " regression) VALUES ('demo', '2026-01-01T00:00:00Z', 'ACCEPTED', 'sha256:aa', NULL, '{}', ?, 0, 0)")


@pytest.fixture
def base(report_inputs: MakeReportInputs) -> Report:
    pins, sources, built, result = report_inputs()
    return document.make_report(pins, lock_record.of(pins), sources, built, result)


def _old_database(path: Path, report_path: Path) -> None:
    """A history as the release before the kind column made it: version 0, one nightly row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.execute(OLD_ROW, (str(report_path),))
    db.commit()
    db.close()


def test_an_old_database_gains_the_kind_column_by_migration(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    _old_database(path, tmp_path / "r" / "report.json")
    history = History(path)
    assert [r.kind for r in history.runs("demo")] == ["nightly"]
    history.add("demo", "t", "ACCEPTED", "sha256:bb", None, {}, tmp_path / "x", 0, False, kind="hand")
    assert [r.kind for r in History(path).runs("demo")] == ["nightly", "hand"]  # opened again: nothing re-applied
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(history_mod.MIGRATIONS)
    db.close()


def test_a_kind_that_is_not_known_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kind 'weekly'"):
        History(tmp_path / "runs.sqlite").add("demo", "t", "ACCEPTED", "i", None, {}, tmp_path, 0, False, kind="weekly")


def _write(report: Report, run_dir: Path, verdict: str = "ACCEPTED") -> Path:
    document.write(report.model_copy(update={"verdict": verdict}), run_dir)
    return run_dir / "report.json"


def test_runs_by_hand_never_become_the_nightly_baseline(base: Report, tmp_path: Path) -> None:
    history = History(tmp_path / "h" / "runs.sqlite")
    nightly = _write(base, tmp_path / "n1")
    history.add(base.name, "t1", "ACCEPTED", base.image_id, None, {}, nightly, 0, False, kind="nightly")
    hand = _write(base, tmp_path / "h1")
    history_mod.record_by_hand(history, base, hand)
    newest = _write(base, tmp_path / "n2")
    assert [r.kind for r in history.runs(base.name)] == ["nightly", "hand"]
    assert history.last_accepted(base.name).report_path == str(nightly)  # type: ignore[union-attr]
    assert compare.last_accepted(history, base, newest) == nightly
    only_hand = History(tmp_path / "h2" / "runs.sqlite")
    history_mod.record_by_hand(only_hand, base, hand)
    assert only_hand.last_accepted(base.name) is None
    with pytest.raises(BadInput, match="no accepted nightly run"):
        compare.last_accepted(only_hand, base, newest)


def test_the_page_marks_a_run_by_hand(base: Report, settings: Settings, tmp_path: Path) -> None:
    history = History(tmp_path / "h" / "runs.sqlite")
    history_mod.record_by_hand(history, base, _write(base, tmp_path / "h1"))
    text = page.render(history, replace(settings, cache_root=tmp_path / "cache"))
    assert 'data-kind="hand"' in text and '<span class="k">by hand</span>' in text and 'id="empty"' not in text


def test_gc_keeps_the_newest_accepted_nightly_run_behind_runs_by_hand(base: Report, settings: Settings,
                                                                       tmp_path: Path) -> None:
    local = replace(settings, cache_root=tmp_path / "cache")
    runs = local.cache("runs")
    history = History(local.cache("history") / "runs.sqlite")
    old = 1_000_000.0
    dirs = []
    for i, kind in enumerate(("nightly", "hand", "hand", "hand")):  # oldest first; every one old and accepted
        run_dir = runs / f"{base.name}-2026010{i}-000000"
        report_json = _write(base, run_dir)
        history.add(base.name, f"t{i}", "ACCEPTED", base.image_id, None, {}, report_json, 0, False, kind=kind)
        for path in (*run_dir.rglob("*"), run_dir):
            os.utime(path, (old + i, old + i))
        dirs.append(run_dir)
    freed = gc.Freed()
    gc.run_dirs(local, cutoff=old + 100, keep=1, freed=freed)
    assert sorted(freed.removed["runs"]) == [str(d) for d in dirs[1:3]]
    assert dirs[0].is_dir() and dirs[3].is_dir()  # the nightly baseline, and the newest (also the newest accepted)
    assert json.loads((dirs[0] / "report.json").read_text())["verdict"] == "ACCEPTED"


def test_bisect_names_no_run_by_hand(base: Report, tmp_path: Path) -> None:
    history = History(tmp_path / "h" / "runs.sqlite")
    nightly = _write(base, tmp_path / "n1")
    history.add(base.name, "2026-11-01T03:00:00Z", "ACCEPTED", base.image_id, None, {}, nightly, 0, False)
    history_mod.record_by_hand(history, base.model_copy(update={"created": "2026-11-01T09:00:00Z"}),
                               _write(base, tmp_path / "h1"))
    assert sides.night(history, None, "2026-11-01", "GOOD") == nightly  # the day's latest night, not the later hand run
    with pytest.raises(BadInput, match="no night '2'"):
        sides.night(history, None, "2", "BAD")
