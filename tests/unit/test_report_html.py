"""`builder report --format html` carries everything report.md does: every cell of every Markdown table (gates,
replay bundles, processes per gate, census, JIT kernels, native inputs, the .sqsh, the cluster's per-node table
and steps, the run manifest) appears on the HTML page, and the replay bundle is a link."""
from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from builder.core.records import Evidence, number
from builder.report import document
from builder.report import html as html_mod
from tests.fixture_types import MakeReportInputs
from tests.rich_report import PROCESS, rich_report


def _text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def _markdown_cells(markdown: str) -> list[str]:
    """Every cell of every Markdown table, as the reader sees it (code marks and escapes gone)."""
    cells = []
    for line in markdown.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            for cell in re.split(r"(?<!\\)\|", line.strip("|")):
                text = " ".join(cell.replace("\\|", "|").replace("`", "").split())
                if text:
                    cells.append(text)
    return cells


def test_every_markdown_cell_is_on_the_html_page(report_inputs: MakeReportInputs) -> None:
    report = rich_report(report_inputs)
    markdown, page = document.to_markdown(report), html_mod.report_html(report)
    text = _text(page)
    missing = [c for c in _markdown_cells(markdown) if c not in text]
    assert missing == []
    for planted in ("planted-helper", "planted_kernel_k1", "tinyrl.main_ppo", "/local/n1/x.sqsh", "812.3"):
        assert planted in markdown and planted in text
    assert '<a href="replay/rl_step.json">replay/rl_step.json</a>' in page
    isolation = "Build container isolation: network interfaces lo, 2 mounts"
    assert isolation in markdown and isolation in text
    assert {f'id="section-{s}"' in page for s in ("replay", "processes", "census", "jit", "cluster", "manifest")} == {True}


def test_a_section_left_out_of_the_page_is_caught(report_inputs: MakeReportInputs, monkeypatch: Any) -> None:
    """The check above can fail: without the census section, its cells are missing from the page."""
    report = rich_report(report_inputs)
    monkeypatch.setattr(document, "census_markdown", lambda gates: [])
    page = html_mod.report_html(report)
    monkeypatch.undo()
    missing = [c for c in _markdown_cells(document.to_markdown(report)) if c not in _text(page)]
    assert "/usr/bin/planted-helper" in " ".join(missing)


def test_markup_in_a_report_is_escaped(report_inputs: MakeReportInputs) -> None:
    report = rich_report(report_inputs)
    hostile = report.model_copy(update={"processes": {"rl_step": [{**PROCESS, "argv": ["<script>x()</script>"]}]}})
    page = html_mod.report_html(hostile)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_one_number_reader_for_every_free_form_value() -> None:
    """records.number: the one reader the page, compare, trust and the report use (a bool is not a number)."""
    assert [number(v) for v in (3, 0.5, True, "1", None)] == [3.0, 0.5, None, None, None]


def test_every_ranks_log_is_written_beside_the_report_and_linked(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    """Under --slurm every rank's log comes back in the evidence (builder/runners/slurm_runner.py); the report writes each
    to logs/<gate>/<rank>.log, keeps the path, and links it from report.md and the HTML page."""
    report = rich_report(report_inputs)
    logs = {"rank0 n1": "trainer: step 1\n", "rank1 n2": "rollout server: serving 2 processes (planted)\n"}
    gates = [g.model_copy(update={"evidence": Evidence.model_validate({**g.evidence.as_dict(), "rank_logs": logs})})
             if g.name == "rl_step" else g for g in report.gates]
    paths = document.write(report.model_copy(update={"gates": gates}), tmp_path)
    assert (tmp_path / "logs" / "rl_step" / "rank1-n2.log").read_text() == logs["rank1 n2"]
    assert paths["logs/rl_step/rank0-n1.log"] == tmp_path / "logs" / "rl_step" / "rank0-n1.log"
    stored = document.load(tmp_path / "report.json")
    kept = next(g for g in stored.gates if g.name == "rl_step").evidence.rank_logs
    assert kept == {"rank0 n1": "logs/rl_step/rank0-n1.log", "rank1 n2": "logs/rl_step/rank1-n2.log"}
    assert "serving 2 processes" not in (tmp_path / "report.json").read_text()
    assert "[rank1 n2](logs/rl_step/rank1-n2.log)" in (tmp_path / "report.md").read_text()
    assert '<a href="logs/rl_step/rank1-n2.log">rank1 n2</a>' in html_mod.report_html(stored)
    document.write(stored, tmp_path)  # written again: the paths stay, the files too
    assert (tmp_path / "logs" / "rl_step" / "rank1-n2.log").read_text() == logs["rank1 n2"]
