"""`builder report --format html` carries everything report.md does: every cell of every Markdown table (gates,
replay bundles, processes per gate, census, JIT kernels, native inputs, the .sqsh, the cluster's per-node table
and steps, the run manifest) appears on the HTML page, and the replay bundle is a link."""
from __future__ import annotations

import html
import re
from typing import Any

from builder.core.records import Evidence, GateResult, NodeFacts, Report, RunnerFacts, SqshFacts
from builder.lock import record as lock_record
from builder.report import document
from builder.report import html as html_mod
from tests.fixture_types import MakeReportInputs

PROCESS = {"pid": 41, "ppid": 1, "name": "python", "argv": ["python", "-m", "tinyrl.main_ppo"], "mnt_ns": "4026532",
           "modules": {"tinyrl": "/opt/venv/tinyrl/__init__.py"}, "libs": 3, "complete": True, "status": "pass",
           "node": "n1"}
CENSUS = {"nodes": {"n1": {"seen": 3, "recorded": 2, "unrecorded": [{"pid": 77, "exe": "/usr/bin/planted-helper"}]}}}
JIT = {"entries": [{"kernel": "planted_kernel_k1", "compiler": "triton", "origin": "compiled during the run"}]}
REPLAY = {"differs": True, "step": 2, "kind": "logprobs", "count": 5, "first": [{"position": 9}],
          "file": "replay/rl_step.json"}


def _rich(report_inputs: MakeReportInputs) -> Report:
    """The demo report with what a cluster run adds: processes, census, JIT entries, a replay bundle, nodes."""
    pins, sources, built, result = report_inputs()
    assert result is not None

    def more(g: GateResult) -> GateResult:
        if g.name != "rl_step":
            return g
        extra: dict[str, Any] = {"processes": [PROCESS], "census": CENSUS, "jit": JIT, "replay": REPLAY}
        return g.model_copy(update={"evidence": Evidence.model_validate({**g.evidence.model_dump(), **extra})})

    facts = RunnerFacts(runner="slurm", engine="slurm 23.02", cluster="demo", job_id="812", partition="debug",
                        nodes=[NodeFacts(name="n1", sqsh_sha256="ab" * 32, sqsh_path="/local/n1/x.sqsh", staged="filled",
                                         check={"seconds": 1.5, "step": "812.0"})],
                        sqsh=SqshFacts(path="/shared/x.sqsh", sha256="ab" * 32),
                        gates={"rl_step": {"job_id": "812", "step": "812.3", "node": "n1", "state": "COMPLETED",
                                           "exit_code": 0, "seconds": 4.2}})
    acceptance = result.model_copy(update={"gates": [more(g) for g in result.gates], "container": facts})
    return document.make_report(pins, lock_record.of(pins), sources, built, acceptance)


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
    report = _rich(report_inputs)
    markdown, page = document.to_markdown(report), html_mod.report_html(report)
    text = _text(page)
    missing = [c for c in _markdown_cells(markdown) if c not in text]
    assert missing == []
    for planted in ("planted-helper", "planted_kernel_k1", "tinyrl.main_ppo", "/local/n1/x.sqsh", "812.3"):
        assert planted in markdown and planted in text
    assert '<a href="replay/rl_step.json">replay/rl_step.json</a>' in page
    assert {f'id="section-{s}"' in page for s in ("replay", "processes", "census", "jit", "cluster", "manifest")} == {True}


def test_a_section_left_out_of_the_page_is_caught(report_inputs: MakeReportInputs, monkeypatch: Any) -> None:
    """The check above can fail: without the census section, its cells are missing from the page."""
    report = _rich(report_inputs)
    monkeypatch.setattr(document, "census_markdown", lambda gates: [])
    page = html_mod.report_html(report)
    monkeypatch.undo()
    missing = [c for c in _markdown_cells(document.to_markdown(report)) if c not in _text(page)]
    assert "/usr/bin/planted-helper" in " ".join(missing)


def test_markup_in_a_report_is_escaped(report_inputs: MakeReportInputs) -> None:
    report = _rich(report_inputs)
    hostile = report.model_copy(update={"processes": {"rl_step": [{**PROCESS, "argv": ["<script>x()</script>"]}]}})
    page = html_mod.report_html(hostile)
    assert "<script>" not in page and "&lt;script&gt;" in page
