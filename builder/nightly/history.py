"""Run history: one SQLite row per run (stdlib sqlite3) with the report's path and its kind: `nightly` (`builder
nightly`) or `hand` (`builder accept`, `builder run`). Only nightly rows are the nightly's baseline.

The schema grows by migrations, numbered by SQLite's `user_version`: `CREATE TABLE IF NOT EXISTS` leaves an
existing table as it was, so a column added later comes with an `ALTER TABLE` for the databases made before it."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import log
from builder.core.options import Settings
from builder.core.records import Report

BUSY_TIMEOUT_S = 60.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pins_name TEXT NOT NULL,
    started TEXT NOT NULL,
    verdict TEXT NOT NULL,
    image_id TEXT NOT NULL,
    digest TEXT,
    commits TEXT NOT NULL,
    report_path TEXT NOT NULL,
    exit_code INTEGER NOT NULL,
    regression INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_name ON runs (pins_name, verdict, id);
"""
KINDS = ("nightly", "hand")
# SCHEMA is version 0, the table as the first release made it; migration N (1-based) brings user_version
# N-1 to N; rows from before the kind column were all nightly runs
MIGRATIONS = (
    "ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'nightly'",
)


@dataclass(frozen=True)
class Run:
    id: int
    pins_name: str
    started: str
    verdict: str
    image_id: str
    digest: str | None
    commits: dict[str, str]
    report_path: str
    exit_code: int
    regression: bool
    kind: str = "nightly"


class History:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        with self._db() as db:
            db.executescript(SCHEMA)
            migrate(db)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """WAL (readers never block the writer) and a busy timeout, so concurrent nightly runs each add their
        row; one transaction per use, committed at the end, and the connection closed."""
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode = WAL")
            with db:
                yield db
        finally:
            db.close()

    def add(self, pins_name: str, started: str, verdict: str, image_id: str, digest: str | None,
            commits: dict[str, str], report_path: Path, exit_code: int, regression: bool,
            kind: str = "nightly") -> int:
        if kind not in KINDS:
            raise ValueError(f"history: kind {kind!r} is not one of {', '.join(KINDS)}")
        with self._db() as db:
            cur = db.execute(
                "INSERT INTO runs (pins_name, started, verdict, image_id, digest, commits, report_path, exit_code,"
                " regression, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (pins_name, started, verdict, image_id, digest, json.dumps(commits, sort_keys=True),
                 str(report_path), exit_code, int(regression), kind))
            return int(cur.lastrowid or 0)

    def last_accepted(self, pins_name: str) -> Run | None:
        """The newest ACCEPTED nightly run of this pins name whose report still exists (a run by hand is never
        the nightly's baseline)."""
        with self._db() as db:
            rows = db.execute("SELECT * FROM runs WHERE pins_name = ? AND verdict = 'ACCEPTED' AND kind = 'nightly'"
                              " ORDER BY id DESC", (pins_name,)).fetchall()
        for row in rows:
            run = _run(row)
            if Path(run.report_path).is_file():
                return run
        return None

    def names(self) -> list[str]:
        """Every pins name with a row, sorted (the history page has one section each)."""
        with self._db() as db:
            return [str(r[0]) for r in db.execute("SELECT DISTINCT pins_name FROM runs ORDER BY pins_name")]

    def runs(self, pins_name: str) -> list[Run]:
        with self._db() as db:
            rows = db.execute("SELECT * FROM runs WHERE pins_name = ? ORDER BY id", (pins_name,)).fetchall()
        return [_run(r) for r in rows]


def record_by_hand(history: History, report: Report, report_json: Path, digest: str | None = None) -> None:
    """A run of `builder accept` or `builder run` as a `hand` row (exit 0 if ACCEPTED, else 1); a history that
    cannot be written is logged, never the run's failure."""
    try:
        history.add(report.name, report.created or "unknown", report.verdict, report.image_id, digest,
                    {n: c.commit for n, c in report.sources.components.items()}, report_json,
                    0 if report.verdict == "ACCEPTED" else 1, False, kind="hand")
    except sqlite3.Error as exc:
        log.info(f"history: run not recorded in {history.path}: {exc}")


def migrate(db: sqlite3.Connection) -> None:
    """Apply the migrations this database has not had yet, each with its new user_version, in one write
    transaction (two runs opening an old database at once: the second waits, then finds nothing left to do)."""
    if int(db.execute("PRAGMA user_version").fetchone()[0]) >= len(MIGRATIONS):
        return
    db.execute("BEGIN IMMEDIATE")
    done = int(db.execute("PRAGMA user_version").fetchone()[0])
    for number, statement in enumerate(MIGRATIONS[done:], start=done + 1):
        db.execute(statement)
        db.execute(f"PRAGMA user_version = {number}")


def _run(row: tuple[Any, ...]) -> Run:
    return Run(id=row[0], pins_name=row[1], started=row[2], verdict=row[3], image_id=row[4], digest=row[5],
               commits=json.loads(row[6]), report_path=row[7], exit_code=row[8], regression=bool(row[9]),
               kind=str(row[10]))


def open_history(settings: Settings) -> History:
    """The history of this cache (history/runs.sqlite): every use case that records or reads runs opens this one."""
    return History(settings.cache("history") / "runs.sqlite")
