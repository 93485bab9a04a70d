"""builder bisect's cases without builds: an inconclusive step repeated then skipped, BAD passing and GOOD failing
(exit 1), bad input (exit 2), the force-push range with its merge-base built, base and lock differences as
candidates, and `builder gc` of bisect directories; real git repositories (pygit2), a probe that knows the answer."""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pygit2
import pytest
import yaml

from builder import cli
from builder.bisect import answer, search, session, sides
from builder.bisect.search import Search, Step, Verdict
from builder.core import files as fs
from builder.core.errors import NotAccepted
from builder.core.options import Settings
from builder.core.records import AcceptanceResult, GateStatus
from builder.nightly import gc
from builder.pins import model as pins_model
from tests.fixture_types import MakeReportInputs

SIG = pygit2.Signature("A", "a@example.invalid", 1735725600, 0)


def commits_of(tmp_path: Path, graph: tuple[tuple[str, str | None], ...]) -> tuple[pygit2.Repository, dict[str, str]]:
    """A bare repository with one commit per (name, parent), subject '<name>: subject'."""
    repo = pygit2.init_repository(str(tmp_path / "r.git"), bare=True)
    tree = repo.TreeBuilder().write()
    sha: dict[str, str] = {}
    for name, parent in graph:
        parents = [pygit2.Oid(hex=sha[parent])] if parent else []
        sha[name] = str(repo.create_commit(None, SIG, SIG, f"{name}: subject\n", tree, parents))
    return repo, sha


def results(report_inputs: MakeReportInputs, *performance: GateStatus) -> list[AcceptanceResult]:
    """One acceptance per run: every gate passing, the performance gate as given."""
    out = []
    for status in performance:
        result = report_inputs(statuses={"performance": status})[3]
        assert result is not None
        out.append(result)
    return out


def test_an_inconclusive_step_runs_again_up_to_the_bound_then_is_skipped(report_inputs: MakeReportInputs) -> None:
    noisy: GateStatus = "inconclusive"
    runs = results(report_inputs, *[noisy] * 5)
    _, verdict, tries = search.gated(lambda: runs.pop(0))
    assert (verdict, tries, len(runs)) == ("skip", search.INCONCLUSIVE_TRIES, 5 - search.INCONCLUSIVE_TRIES)
    runs = results(report_inputs, "inconclusive", "pass", "inconclusive")
    assert search.gated(lambda: runs.pop(0))[1:] == ("good", 2)  # decided on its second run
    runs = results(report_inputs, "fail", "pass")
    assert search.gated(lambda: runs.pop(0))[1:] == ("bad", 1)
    exact = report_inputs(statuses={"performance": "inconclusive", "zero_update": "fail"})[3]
    assert exact is not None and search.gated(lambda: exact)[1:] == ("bad", 1)  # an exact gate decides at once


def test_a_search_skips_the_commit_whose_step_stays_inconclusive(report_inputs: MakeReportInputs) -> None:
    series = [f"c{i}" for i in range(1, 8)]  # c4 is the first bad commit; c3's performance gate stays noisy
    ran: list[str] = []

    def probe(cs: dict[str, str], why: str) -> Step:
        at = int(cs["verl"][1:])
        status: GateStatus = "inconclusive" if at == 3 else "fail" if at >= 4 else "pass"

        def accept() -> AcceptanceResult:
            ran.append(cs["verl"])
            return results(report_inputs, status)[0]
        _, verdict, tries = search.gated(accept)
        return Step(cs, verdict, why, gate="performance" if verdict != "good" else "", reason=f"{tries} runs")

    found = search.bisect(Search(probe), "verl", {"verl": "c7"}, "c0", series)
    assert found.first_bad is None and found.candidates == ["c3", "c4"] and found.skipped == ["c3"]
    assert ran.count("c3") == search.INCONCLUSIVE_TRIES and ran.count("c4") == 1


def two_sides(report_inputs: MakeReportInputs, good: dict[str, str], bad: dict[str, str]) -> tuple[sides.Side, ...]:
    pins = report_inputs()[0]
    return sides.Side("good.yaml", pins, good, None), sides.Side("bad.yaml", pins, bad, None)


def probe_bad_from(bad_commits: set[str], calls: list[str]) -> search.Probe:
    def probe(cs: dict[str, str], why: str) -> Step:
        calls.append(why)
        verdict: Verdict = "bad" if cs["verl"] in bad_commits else "good"
        return Step(cs, verdict, why, gate="zero_update" if verdict == "bad" else "", reason="differs")
    return probe


def test_bad_passing_and_good_failing_are_exit_1(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    repo, sha = commits_of(tmp_path, (("main", None), ("g", "main"), ("b", "g")))
    good, bad = two_sides(report_inputs, {"verl": sha["g"]}, {"verl": sha["b"]})
    heads = {"verl": sha["main"]}
    for d in ("1", "2"):
        (tmp_path / d).mkdir()
    with pytest.raises(NotAccepted, match=r"^BAD passes: nothing to bisect \(bad.yaml\)$") as passes:
        session.run(good, bad, probe_bad_from(set(), []), lambda n: repo, heads, tmp_path / "1", "r", None)
    assert passes.value.exit_code == 1
    with pytest.raises(NotAccepted, match=r"^GOOD fails: nothing to bisect \(good.yaml: zero_update: differs\)"):
        session.run(good, bad, probe_bad_from({sha["g"], sha["b"]}, []), lambda n: repo, heads, tmp_path / "2", "r",
                    None)


@pytest.mark.parametrize("base_bad", [False, True], ids=["merge-base-good", "merge-base-bad"])
def test_after_a_force_push_the_range_is_the_prs_commits_since_the_merge_base_which_is_built(
        report_inputs: MakeReportInputs, tmp_path: Path, capsys: pytest.CaptureFixture[str], base_bad: bool) -> None:
    # a (GOOD) was the PR's commit on m; the PR was force-pushed to b', c' on m: a is no ancestor of c'
    repo, sha = commits_of(tmp_path, (("m", None), ("a", "m"), ("b2", "m"), ("c2", "b2")))
    good, bad = two_sides(report_inputs, {"verl": sha["a"]}, {"verl": sha["c2"]})
    calls: list[str] = []
    bad_commits = {sha["b2"], sha["c2"]} | ({sha["m"]} if base_bad else set())
    got = session.run(good, bad, probe_bad_from(bad_commits, calls), lambda n: repo, {"verl": sha["m"]}, tmp_path,
                      "r", None)
    said = f"GOOD's verl commit {sha['a'][:12]} is not an ancestor of BAD's (a force-push?)"
    assert any(n.startswith(said) for n in got["notes"]) and said in capsys.readouterr().err
    assert "verl 1/3" in calls  # the merge-base (1 of m, b', c') is built like any commit, not assumed good
    first = sha["m"] if base_bad else sha["b2"]
    assert got["first_bad"]["commit"] == first and got["first_bad"]["subject"] == f"{'m' if base_bad else 'b2'}: subject"
    assert got["last_good"]["commit"] == (sha["a"] if base_bad else sha["m"])


def test_base_and_lock_differences_are_candidates_of_their_own(report_inputs: MakeReportInputs,
                                                              tmp_path: Path) -> None:
    pins = report_inputs()[0]
    other = tmp_path / "other"
    shutil.copytree(Path(str(pins.path)).parent, other)
    data = yaml.safe_load((other / "demo.yaml").read_text())
    data["base"]["image"] = data["base"]["image"].split("@")[0] + "@sha256:" + "ef" * 32
    (other / "demo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    lock = other / "locks" / "demo.lock"
    lock.write_text(lock.read_text() + "\n# another lock\n")
    good = sides.Side("good.yaml", pins, {"verl": "g"}, None)
    bad = sides.Side("bad.yaml", pins_model.load(other / "demo.yaml"), {"verl": "b"}, None)
    found = sides.differences(good, bad)
    assert [d.split(":")[0] for d in found] == ["base.image", "build.lock"]
    assert "ef" * 32 in found[0] and str(lock) in found[1]
    assert sides.differences(good, good) == []
    text = answer.to_markdown({"good": "g", "bad": "b", "other_differences": found, "steps": [], "builds": 0,
                               "bound": 0})
    assert "## Other differences (candidates of their own)" in text and found[0] in text


@pytest.mark.parametrize(("argv", "line"), [
    (["bisect", "/nonexistent/good.yaml", "/nonexistent/bad.yaml"],
     "GOOD: /nonexistent/good.yaml is not a file (expected a pins file or a run's report.json)"),
    (["bisect", "/nonexistent/good.yaml"], "bisect: expected GOOD (or --good-night) and BAD (or --bad-night), one of each"),
])
def test_bad_input_is_exit_2_in_one_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and line in err[0]


def test_gc_removes_ended_bisects_directories_and_keeps_a_live_ones(settings: Settings, tmp_path: Path) -> None:
    here = replace(settings, cache_root=tmp_path / "cache")
    root = here.cache("bisect")
    for name, run_id in (("ended", "run-ended"), ("live", "run-live"), ("no-state", None)):
        (root / name / "step-1").mkdir(parents=True)
        if run_id:
            answer.save_state(root / name / answer.STATE, "g", "b", run_id, [])
    fs.hold(here.live_lock("run-live"))
    old = time.time() - 3600
    for path in root.rglob("*"):
        os.utime(path, (old, old))
    freed = gc.Freed()
    gc.bisect_dirs(here, time.time() - 60, freed)
    assert sorted(p.name for p in root.iterdir()) == ["live"]
    assert sorted(Path(p).name for p in freed.removed["bisect"]) == ["ended", "no-state"]
    assert freed.kept_live["bisect"] == [str(root / "live")]
    fresh = root / "fresh"
    fresh.mkdir()
    gc.bisect_dirs(here, time.time() - 60, gc.Freed())
    assert fresh.is_dir()  # younger than the age
    fs.release(here.live_lock("run-live"))
    json.loads((root / "live" / answer.STATE).read_text())  # the live one's state untouched
