"""A run's report as one self-contained HTML page (`builder report RUN --format html`), and the jinja2
environment that the nightly history page (builder/nightly/page.py) renders with.

The templates are package data (builder/report/templates/, reached through core/resources.py), autoescaped
with undefined names refused. A page loads nothing: styles are inline, there is no script, no font, no
image from elsewhere; it reads the same from `file://`, as a mail attachment or a CI artifact.
"""
from __future__ import annotations

import functools
import re
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markdown_it import MarkdownIt
from markupsafe import Markup

from builder.core import resources
from builder.core.imageref import split_digest
from builder.core.records import DockerFacts, GateResult, Report, RunnerFacts, SlurmFacts
from builder.report import document
from builder.report.document import readable_evidence

FAILING = ("fail", "inconclusive")
# https://host/owner/repo(.git) or git@host:owner/repo(.git): the forges whose PR pages have a known address
FORGE = re.compile(r"^(?:https://|git@)(?P<host>github\.com|gitlab\.com)[/:](?P<path>[\w.-]+/[\w.-]+?)(?:\.git)?/?$")


def pr_url(url: str, pr: int) -> str | None:
    """The PR's page for a repository on a known forge, else None (a local or unknown remote: no link)."""
    found = FORGE.match(url)
    if found is None:
        return None
    where = "pull" if found["host"] == "github.com" else "-/merge_requests"
    return f"https://{found['host']}/{found['path']}/{where}/{pr}"


def short(digest: str | None, keep: int = 12) -> str:
    """`sha256:0123456789ab` of a digest, a bare hex shortened, '-' for none."""
    if not digest:
        return "-"
    algo, hexpart = split_digest(digest)
    return f"{algo + ':' if algo else ''}{hexpart[:keep]}"


def megabytes(size: Any) -> str:
    return f"{size / 1e6:.1f} MB" if isinstance(size, (int, float)) and not isinstance(size, bool) else "-"


def number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def status(value: str) -> Markup:
    """A status or verdict as a coloured badge (filters, not macros: a page of 365 nights calls them thousands
    of times)."""
    return Markup('<span class="s s-{}">{}</span>').format(value.split(" ")[0], value.replace("_", " "))


def failure_class(value: str | None) -> Markup:
    return Markup(' <span class="c c-{}">{}</span>').format(value, value) if value else Markup("")


def pr_link(component: Any) -> Markup:
    """#N linked to the PR's page where the forge is known, else with the repository as its title (a component
    record or the page's dict of one)."""
    url, pr = (component["url"], component["pr"]) if isinstance(component, dict) else (component.url, component.pr)
    link = pr_url(str(url), int(pr))
    if link:
        return Markup('<a href="{}">#{}</a>').format(link, pr)
    return Markup('<span title="{}">#{}</span>').format(url, pr)


@functools.cache
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(resources.report_templates()), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(short=short, mb=megabytes, num=number, status=status, failure_class=failure_class,
                       pr_link=pr_link)
    env.globals.update(pr_url=pr_url, FAILING=FAILING)
    return env


def render(template: str, **data: Any) -> str:
    return environment().get_template(template).render(**data)


def plain(value: Any) -> dict[str, Any]:
    """A record's free-form part (a gate's evidence, the runner's facts, a run-manifest layer) as a plain dict,
    whether the record keeps it as a dict or as a model."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    dumped = value.model_dump(mode="json")
    return dumped if isinstance(dumped, dict) else {}


def container(report: Report) -> RunnerFacts:
    return report.acceptance.where if report.acceptance else DockerFacts()


def gate_rows(report: Report) -> list[dict[str, Any]]:
    """Per gate: status, required, reason, the evidence chosen for reading, and its wall seconds."""
    facts = container(report).gates
    return [{"name": g.name, "status": g.status, "required": g.name in report.required_gates, "reason": g.reason,
             "evidence": readable_evidence(g.evidence), "seconds": gate_seconds(g, facts)}
            for g in report.gates]


def gate_seconds(gate: GateResult, facts: dict[str, Any]) -> float | None:
    """A gate's wall time: the runner's clock around it, else what the suite measured inside the container."""
    for value in ((facts.get(gate.name) or {}).get("seconds"), gate.evidence.seconds):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def runner(report: Report) -> dict[str, Any]:
    """Where the gates ran: the runner kind (docker, slurm, runc), the node (or engine host) and the .sqsh
    sha256 the gates mounted, if any."""
    facts = container(report)
    pulled = report.acceptance.pulled if report.acceptance else None
    host = pulled.engine.host if pulled and pulled.engine else None
    cluster = facts if isinstance(facts, SlurmFacts) else None
    nodes = ", ".join(n.name for n in cluster.nodes) if cluster else ""
    return {"kind": facts.runner, "node": nodes or host or "this host", "engine": facts.engine or "unknown",
            "sqsh_sha256": cluster.sqsh.sha256 if cluster and cluster.sqsh else None}


@functools.cache
def _markdown() -> MarkdownIt:
    """CommonMark with tables; raw HTML in a report's text is escaped, never passed through, and no emphasis
    (a path's `__init__` stays as written)."""
    return MarkdownIt("commonmark", {"html": False}).enable("table").disable("emphasis")


def sections(report: Report) -> list[tuple[str, Markup]]:
    """The Markdown report's evidence sections, each as (id, HTML) from the same functions that write report.md:
    replay bundles and every rank's log (linked), processes per gate, census, JIT kernels, native inputs, the .sqsh, the cluster's
    per-node table and steps, the rebuild check and the run manifest. A section with nothing to say is left out."""
    parts = {
        "replay": document.replay_markdown(report.gates),
        "logs": document.rank_logs_markdown(report.gates),
        "processes": document.processes_markdown(report.processes),
        "libraries": document.libraries_markdown(report),
        "runtime_libraries": document.runtime_libraries_markdown(report),
        "census": document.census_markdown(report.gates),
        "jit": document.jit_markdown(report.gates),
        "build-isolation": document.build_isolation_markdown(report.build),
        "native": document.native_markdown(report.run_manifest.native_build),
        "sqsh": document.sqsh_markdown(report),
        "cluster": document.cluster_markdown(report),
        "rebuild": document.rebuild_markdown(report.rebuild) if report.rebuild else [],
        "manifest": ["", "### Run manifest (six layers; unknown = not captured)", "",
                     *document.run_manifest_markdown(report)],
    }
    return [(name, Markup(_markdown().render("\n".join(lines) + "\n"))) for name, lines in parts.items() if lines]


def report_html(report: Report) -> str:
    tp = report.acceptance.throughput if report.acceptance else {}
    return render("report.html.j2", report=report, gates=gate_rows(report), runner=runner(report), throughput=tp,
                  digest=report.publish.digest if report.publish else None, sections=sections(report),
                  base=report.run_manifest.container)
