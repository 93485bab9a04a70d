"""builder bisect's search without builds: a probe that knows which commits are bad, skipped or unbuildable."""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pygit2
import pytest

from builder.bisect import answer, commits, search, session, sides
from builder.bisect.search import Search, Step, Verdict
from builder.core import files as fs
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.lock import record as lock_record
from builder.nightly import notify, page
from builder.nightly.history import History
from builder.pipeline import nightly_runs
from builder.report import document
from tests.fixture_types import MakeReportInputs
from tests.history_nights import demo_plans, write_nights

SERIES = [f"c{i}" for i in range(16)]  # c0 is GOOD's commit; c1..c15 the range, c15 BAD's


def probe_for(first_bad: dict[str, int], skip: frozenset[str] = frozenset(), together: bool = False,
              calls: list[dict[str, str]] | None = None) -> search.Probe:
    """bad when a component is at or past its first bad index (all of them with `together`, else any)."""
    def probe(cs: dict[str, str], why: str) -> Step:
        if calls is not None:
            calls.append(cs)
        if any(c in skip for c in cs.values()):
            return Step(cs, "skip", why, gate="build", reason="does not build")
        hits = [int(cs[n][1:]) >= i for n, i in first_bad.items()]
        verdict: Verdict = "bad" if (all(hits) if together else any(hits)) else "good"
        return Step(cs, verdict, why, gate="zero_update" if verdict == "bad" else "", reason="diff 1e-3")
    return probe


GOOD = {"vllm": "c0", "megatron": "c0", "verl": "c0"}
BAD = {"vllm": "c0", "megatron": "c0", "verl": "c15"}


def test_names_the_planted_commit_within_the_bound() -> None:
    calls: list[dict[str, str]] = []
    s = Search(probe_for({"verl": 7}, calls=calls))
    found = search.bisect(s, "verl", BAD, "c0", SERIES[1:])
    assert (found.first_bad, found.last_good) == ("c7", "c6")
    assert len(calls) <= math.ceil(math.log2(15))


def test_first_commit_of_the_range_bad_and_good_is_last_good() -> None:
    found = search.bisect(Search(probe_for({"verl": 1})), "verl", BAD, "c0", SERIES[1:])
    assert (found.first_bad, found.last_good) == ("c1", "c0")


def test_a_skipped_commit_is_stepped_around() -> None:
    calls: list[dict[str, str]] = []
    s = Search(probe_for({"verl": 10}, skip=frozenset({"c8"}), calls=calls))
    found = search.bisect(s, "verl", BAD, "c0", SERIES[1:])
    assert found.first_bad == "c10" and len(calls) <= math.ceil(math.log2(15)) + 1


def test_skips_bordering_the_answer_name_a_range() -> None:
    found = search.bisect(Search(probe_for({"verl": 9}, skip=frozenset({"c8"}))), "verl", BAD, "c0", SERIES[1:])
    assert found.first_bad is None and found.candidates == ["c8", "c9"] and found.skipped == ["c8"]
    assert found.last_good == "c7"


def test_which_component_and_the_two_repository_case() -> None:
    bad = {"vllm": "c0", "megatron": "c15", "verl": "c15"}
    one = search.culprits(Search(probe_for({"verl": 5})), GOOD, bad)
    assert one.components == ["verl"] and not one.together
    both = search.culprits(Search(probe_for({"megatron": 4, "verl": 9}, together=True)), GOOD, bad)
    assert both.components == ["megatron", "verl"] and both.together and both.held == "BAD"
    assert "together" in both.note


def test_max_steps_names_the_range_left_and_a_rerun_resumes(tmp_path: Path) -> None:
    calls: list[dict[str, str]] = []
    first = Search(probe_for({"verl": 7}, calls=calls), max_steps=2)
    with pytest.raises(search.OutOfSteps, match="first bad commit among"):
        search.bisect(first, "verl", BAD, "c0", SERIES[1:])
    state = tmp_path / answer.STATE
    answer.save_state(state, "g", "b", "run", list(first.done.values()))
    calls.clear()
    again = Search(probe_for({"verl": 7}, calls=calls), answer.load_state(state, "g", "b"))
    assert search.bisect(again, "verl", BAD, "c0", SERIES[1:]).first_bad == "c7"
    assert len(calls) == len(again.done) - 2  # the two saved steps were not probed again
    with pytest.raises(BadInput, match="another bisect"):
        answer.load_state(state, "g", "other")


def test_range_along_first_parents_and_after_a_force_push(tmp_path: Path) -> None:
    repo = pygit2.init_repository(str(tmp_path / "r.git"), bare=True)
    sig = pygit2.Signature("A", "a@example.invalid", 1735725600, 0)
    tree = repo.TreeBuilder().write()

    def commit(msg: str, *parents: str) -> str:
        return str(repo.create_commit(None, sig, sig, msg + "\n", tree, [pygit2.Oid(hex=p) for p in parents]))

    main = commit("main")
    a = commit("a", main)
    b = commit("b", a)
    c = commit("c", b)
    got = commits.commit_range(repo, "verl", a, c, main)
    assert [x.subject for x in got.commits] == ["b", "c"] and got.note == ""
    pushed = commit("c'", commit("b'", main))  # a force-push: a is no ancestor of the new head
    moved = commits.commit_range(repo, "verl", a, pushed, main)
    assert [x.sha for x in moved.commits][0] == main and "force-push" in moved.note
    with pytest.raises(BadInput, match="BAD: components.verl.commit"):
        commits.commit_range(repo, "verl", a, "f" * 40, main)


def test_the_history_row_links_the_first_bad_commit_and_the_message_names_it(report_inputs: MakeReportInputs,
                                                                              settings: Settings,
                                                                              tmp_path: Path) -> None:
    pins, sources, built, result = report_inputs()
    base = document.make_report(pins, lock_record.of(pins), sources, built, result)
    history = History(tmp_path / "history" / "runs.sqlite")
    paths = write_nights(base, demo_plans(*(c * 20 for c in ("a1", "b2", "c3", "d4"))), tmp_path / "runs", history)
    red = paths[2]  # the first failing night
    first = {"component": "verl", "commit": "e" * 40, "pr": 42, "subject": "s5", "gate": "zero_update"}
    (red.parent / page.BISECT).mkdir()
    fs.write_atomic(red.parent / page.BISECT / "bisect.json", json.dumps({"first_bad": first}))
    text = nightly_runs.history_page(replace(settings, cache_root=tmp_path / "cache"), history=history).read_text()
    rows = dict(re.findall(r'<tr id="night-(\d+)"(.*?)</tr>', text, re.S))
    assert [n for n, r in sorted(rows.items()) if "first bad: verl eeeeeeeeee (zero_update)" in r] == ["3"]
    assert str(red.parent / page.BISECT / "bisect.md") in rows["3"]
    message = notify.payload(base, "verdict flipped", None, "-", None, "verl eeeeeeeeeeee (PR #42) s5: zero_update")
    fields = {f["title"]: f["value"] for f in message["attachments"][0]["fields"]}
    assert fields["first bad commit"].startswith("verl eeeeeeeeeeee")
    assert "first bad commit" not in str(notify.payload(base, "verdict flipped", None, "-", None))


def test_a_session_names_both_components_of_a_two_repository_defect(report_inputs: MakeReportInputs,
                                                                     tmp_path: Path) -> None:
    pins = report_inputs()[0]
    repo = pygit2.init_repository(str(tmp_path / "r.git"), bare=True)
    sig = pygit2.Signature("A", "a@example.invalid", 1735725600, 0)
    tree = repo.TreeBuilder().write()
    sha: dict[str, str] = {}
    for name, parent in (("main", None), ("g", "main"), ("q1", "g"), ("q2", "q1"), ("t1", "g"), ("t2", "t1")):
        parents = [pygit2.Oid(hex=sha[parent])] if parent else []
        sha[name] = str(repo.create_commit(None, sig, sig, f"{name}: subject\n", tree, parents))
    good = sides.Side("good.yaml", pins, {"vllm": sha["g"], "megatron": sha["g"], "verl": sha["g"]}, None)
    bad = sides.Side("bad.yaml", pins, {"vllm": sha["g"], "megatron": sha["q2"], "verl": sha["t2"]}, None)
    calls: list[str] = []

    def probe(cs: dict[str, str], why: str) -> Step:
        calls.append(why)
        verdict: Verdict = "bad" if cs["megatron"] == sha["q2"] and cs["verl"] == sha["t2"] else "good"
        return Step(cs, verdict, why, gate="zero_update" if verdict == "bad" else "", reason="differs")

    got = session.run(good, bad, probe, lambda n: repo, {n: sha["main"] for n in good.commits}, tmp_path, "r", None)
    assert got["together"] and got["components"] == ["megatron", "verl"]
    assert got["first_bad"]["commit"] == sha["q2"] and got["first_bad"]["subject"] == "q2: subject"
    assert any(n.startswith(f"verl: first bad {sha['t2'][:12]}") for n in got["notes"])
    assert calls == ["BAD", "GOOD", "megatron back to GOOD", "verl back to GOOD", "megatron 1/2", "verl 1/2"]
    assert got["builds"] <= got["bound"]
    assert "first bad commit: megatron" in answer.to_markdown(got).lower()


def test_nights_by_date_or_id_and_a_gone_report_is_bad_input(tmp_path: Path) -> None:
    history = History(tmp_path / "runs.sqlite")
    kept = tmp_path / "kept" / "report.json"
    kept.parent.mkdir()
    kept.write_text("{}")
    history.add("demo", "2026-12-01T02:00:00Z", "ACCEPTED", "sha256:a", None, {}, kept, 0, False)
    gone = history.add("demo", "2026-12-02T02:00:00Z", "NOT ACCEPTED", "sha256:b", None, {}, tmp_path / "gone.json",
                       1, False)
    history.add("demo", "2026-12-01T09:00:00Z", "ACCEPTED", "sha256:c", None, {}, kept, 0, False, kind="hand")
    assert sides.night(history, "demo", "2026-12-01", "--good-night") == kept
    assert sides.night(history, None, "1", "--good-night") == kept
    with pytest.raises(BadInput, match="no night '3'"):  # the run by hand
        sides.night(history, "demo", "3", "--good-night")
    with pytest.raises(BadInput, match=rf"--bad-night: night {gone} \(2026-12-02T02:00:00Z\) of demo: its report .* is gone"):
        sides.night(history, "demo", "2026-12-02", "--bad-night")
    with pytest.raises(BadInput, match="--bad-night: no night '2026-12-03'"):
        sides.night(history, "demo", "2026-12-03", "--bad-night")
