"""Exports on a base whose tree is not kept yet run one at a time (builder/release/sqsh.py first_on_base): the
first keeps the tree, the others wait for it; once it is kept, exports run side by side."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from builder.release import sqsh
from builder.release import sqsh_trees as kept

BASE = ["sha256:" + "a" * 64, "sha256:" + "b" * 64]


def keep_tree(trees: Path) -> None:
    entry = trees / kept.key(BASE)
    entry.mkdir(parents=True)
    (entry / "tree.json").write_text(json.dumps({"diff_ids": BASE, "xattrs": False, "entries": {}}))


def timeline(trees: Path, first_keeps: bool, side_by_side: bool = False) -> list[str]:
    """The order in which two exports go in and out. `side_by_side`: the first stays inside until the second is in
    too (at most 10 s), however slowly a busy host starts the second thread; else it stays 0.3 s."""
    events: list[str] = []
    inside, second_in = threading.Event(), threading.Event()

    def export(name: str, keeps: bool) -> None:
        with sqsh.first_on_base(trees, BASE):
            events.append(f"in {name}")
            (inside if name == "a" else second_in).set()
            if name == "a" and side_by_side:
                second_in.wait(10)
            else:
                time.sleep(0.3)
            if keeps:
                keep_tree(trees)
            events.append(f"out {name}")

    one = threading.Thread(target=export, args=("a", first_keeps))
    one.start()
    assert inside.wait(5)
    two = threading.Thread(target=export, args=("b", False))
    two.start()
    one.join()
    two.join()
    return events


def test_an_export_waits_for_the_first_on_a_new_base_and_then_runs_warm(tmp_path: Path) -> None:
    assert timeline(tmp_path, first_keeps=True) == ["in a", "out a", "in b", "out b"]


def test_a_failed_first_export_leaves_the_next_one_to_make_the_tree(tmp_path: Path) -> None:
    assert timeline(tmp_path, first_keeps=False) == ["in a", "out a", "in b", "out b"]


def test_exports_on_a_kept_base_run_side_by_side(tmp_path: Path) -> None:
    keep_tree(tmp_path)
    events = timeline(tmp_path, first_keeps=False, side_by_side=True)
    # b went in while a was still inside; which of the two comes out first is up to the scheduler on a busy host
    assert events[:2] == ["in a", "in b"] and sorted(events[2:]) == ["out a", "out b"], events


def test_an_export_without_a_base_never_waits(tmp_path: Path) -> None:
    events = []
    with sqsh.first_on_base(tmp_path, None), sqsh.first_on_base(tmp_path, []):
        events.append("in")
    assert events == ["in"] and not list(tmp_path.iterdir())
