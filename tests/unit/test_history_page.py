"""The nightly history page on a history of demo nights (tests/history_nights.py: good, good, the slow PR, the
zero_update defect twice, the fix): failure classes, the failing nights marked, trends drawn, rows whose report
is gone, hostile text escaped, the facts cache; and a run's report as HTML."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import Report
from builder.lock import record as lock_record
from builder.nightly import page
from builder.nightly.history import History
from builder.pipeline import accepting, nightly_runs
from builder.report import document
from builder.report import html as html_mod
from tests.fixture_types import MakeReportInputs
from tests.history_nights import demo_plans, write_nights

GOOD, SLOW, DEFECT, FIXED = ("a1" * 20, "b2" * 20, "c3" * 20, "d4" * 20)


@pytest.fixture
def base(report_inputs: MakeReportInputs) -> Report:
    pins, sources, built, result = report_inputs()
    return document.make_report(pins, lock_record.of(pins), sources, built, result)


@pytest.fixture
def local(settings: Settings, tmp_path: Path) -> Settings:
    return replace(settings, cache_root=tmp_path / "cache")


def _history(base: Report, tmp_path: Path) -> tuple[History, list[Path]]:
    history = History(tmp_path / "history" / "runs.sqlite")
    return history, write_nights(base, demo_plans(GOOD, SLOW, DEFECT, FIXED), tmp_path / "runs", history)


def _row(text: str, night: int) -> str:
    found = re.search(rf'<tr id="night-{night}"[^>]*>.*?</tr>', text, re.S)
    assert found, f"no row for night {night}"
    return found.group(0)


def test_demo_nights_are_classified_new_recurring_fixed(base: Report, tmp_path: Path) -> None:
    history, _ = _history(base, tmp_path)
    nights = page.nights(history, base.name, 365, page.FactsCache(tmp_path / "cache.json"))
    assert [n.row.verdict for n in nights] == ["ACCEPTED"] * 2 + ["NOT ACCEPTED"] * 3 + ["ACCEPTED"]
    assert [n.classes for n in nights] == [{}, {}, {"performance": "new"}, {"zero_update": "new", "performance": "fixed"},
                                           {"zero_update": "recurring"}, {"zero_update": "fixed"}]
    assert [n.state for n in nights] == ["ok", "ok", "bad", "bad", "bad", "ok"]


def test_the_page_marks_the_failing_nights_and_draws_the_trends(base: Report, local: Settings, tmp_path: Path) -> None:
    history, _ = _history(base, tmp_path)
    path = nightly_runs.history_page(local, history=history)
    text = path.read_text()
    assert path == history.path.parent / "history.html"
    assert [_row(text, n).split(">")[0].count("failing") for n in range(1, 7)] == [0, 0, 1, 1, 1, 0]
    assert re.findall(r'<a class="(\w+)" href="#night-\d+"', text) == ["ok", "ok", "bad", "bad", "bad", "ok"]
    assert 'c c-new">new' in _row(text, 3) and "the slow exact path" in _row(text, 3)
    assert 'c c-recurring">recurring' in _row(text, 5) and 'c c-fixed">fixed' in _row(text, 6)
    assert text.count("<svg") == 1 and "throughput ratio (aligned / control)" in text and "min_ratio" in text
    assert 'href="#night-3"' in text.split("<svg", 1)[1]  # the red marker on the ratio chart links to its row
    assert "http://" not in text.replace("http://www.w3.org/", "") and "https://" not in text and "<script" not in text
    assert 'class="compare"' in text and "commits moved: vllm" in text  # the fix against the last good night


def test_a_row_whose_report_is_gone_shows_as_such(base: Report, local: Settings, tmp_path: Path) -> None:
    history, paths = _history(base, tmp_path)
    paths[1].unlink()  # night 2, as `builder gc` leaves it
    text = nightly_runs.history_page(local, history=history).read_text()
    assert "report gone" in _row(text, 2) and "gone" in _row(text, 2).split(">")[0]
    assert 'c c-unknown">unknown' in _row(text, 3)  # the night after: no previous night to classify against
    assert "report gone" not in _row(text, 1)


def test_hostile_reasons_are_escaped(base: Report, local: Settings, tmp_path: Path) -> None:
    history = History(tmp_path / "h" / "runs.sqlite")
    plan = demo_plans(GOOD, SLOW, DEFECT, FIXED)[2]
    write_nights(base, [replace(plan, failing={"performance": "<script>alert(1)</script>"})], tmp_path / "runs", history)
    text = nightly_runs.history_page(local, history=history).read_text()
    assert "<script>alert" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_facts_are_cached_by_the_report_file(base: Report, tmp_path: Path) -> None:
    history, paths = _history(base, tmp_path)
    cache = page.FactsCache(tmp_path / "cache.json")
    page.nights(history, base.name, 365, cache)
    cache.save()
    again = page.FactsCache(tmp_path / "cache.json")
    assert set(again.entries) == {str(p) for p in paths}
    paths[0].write_text(paths[0].read_text().replace('"ACCEPTED"', '"NOT ACCEPTED"', 1))  # a changed file is read again
    assert again.facts(str(paths[0])) is not None and again.changed


def test_last_takes_the_newest_nights_classified_against_the_one_before(base: Report, local: Settings,
                                                                         tmp_path: Path) -> None:
    history, _ = _history(base, tmp_path)
    nights = page.nights(history, base.name, 2, page.FactsCache(tmp_path / "cache.json"))
    assert [n.row.id for n in nights] == [5, 6] and nights[0].classes == {"zero_update": "recurring"}
    with pytest.raises(BadInput, match="--last"):
        nightly_runs.history_page(local, last=0, history=history)


def test_an_empty_history_renders_a_page_that_says_so(local: Settings, tmp_path: Path) -> None:
    text = nightly_runs.history_page(local, history=History(tmp_path / "h" / "runs.sqlite")).read_text()
    assert 'id="empty"' in text and "<svg" not in text


def test_report_as_html_from_the_same_templates(base: Report, tmp_path: Path) -> None:
    failed = base.model_copy(update={"verdict": "NOT ACCEPTED", "reasons": ["required gate control: fail (x)"]})
    document.write(failed, tmp_path)
    text = accepting.report_html(tmp_path / "report.json")
    assert 'id="verdict" class="banner bad">NOT ACCEPTED' in text
    assert all(f"<td>{g.name}</td>" in text for g in base.gates) and "required gate control: fail (x)" in text
    assert "<script" not in text and base.image_id in text


@pytest.mark.parametrize("url,link", [
    ("https://github.com/vllm-project/vllm.git", "https://github.com/vllm-project/vllm/pull/7"),
    ("git@github.com:NVIDIA/Megatron-LM.git", "https://github.com/NVIDIA/Megatron-LM/pull/7"),
    ("https://gitlab.com/group/repo", "https://gitlab.com/group/repo/-/merge_requests/7"),
    ("demo-stack/tinyengine.git", None), ("https://example.org/x/y.git", None)])
def test_pr_links_only_where_the_forge_is_known(url: str, link: str | None) -> None:
    assert html_mod.pr_url(url, 7) == link


def test_the_command_writes_the_page_and_prints_its_path(base: Report, tmp_path: Path) -> None:
    history = History(tmp_path / "cache" / "history" / "runs.sqlite")
    write_nights(base, demo_plans(GOOD, SLOW, DEFECT, FIXED)[:3], tmp_path / "runs", history)
    out = tmp_path / "page.html"
    env = {**os.environ, "BUILDER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "builder", "history", "--html", str(out), "--last", "2"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out) and out.read_text().count('<tr id="night-') == 2


def test_charts_are_drawn_once_per_change_of_what_they_show(base: Report, local: Settings, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Every nightly renders every name's section: a section whose nights did not change reuses its stored SVG, a new
    night draws that section again, and a render of every name removes the charts no section draws any more."""
    history, _ = _history(base, tmp_path)
    drawn: list[int] = []
    draw = page.charts

    def counted(nights: list[page.Night]) -> str:
        drawn.append(len(nights))
        return draw(nights)

    monkeypatch.setattr(page, "charts", counted)
    first = page.render(history, local)
    second = page.render(history, local)
    assert drawn == [6] and second.split("generated", 1)[0] == first.split("generated", 1)[0]
    stored = list((history.path.parent / page.CHARTS).glob("*.svg"))
    assert len(stored) == 1 and stored[0].read_text() in second
    write_nights(base, demo_plans(GOOD, SLOW, DEFECT, FIXED)[:1], tmp_path / "more", history)  # a seventh night
    third = page.render(history, local)
    assert drawn == [6, 7] and third != second
    assert [p.name for p in (history.path.parent / page.CHARTS).glob("*.svg")] != [stored[0].name]  # the old one went
