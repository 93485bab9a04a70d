"""One run, one list of test results: the suites every test-result format is written from (junit.xml, ctrf.json
and the signed in-toto test result), so that no case is in one format and not another.

`acceptance` holds one case per gate, as the verdict saw them; `placement` holds `sqsh_smoke`, the smoke of the
enroot `.sqsh` placed beside the registry digest. junit.xml and ctrf.json carry both suites; the in-toto test result
is one statement per suite (builder/release/attest.py): the acceptance one, signed at acceptance over the image,
and the placement one, signed when the `.sqsh` is placed (or exported) over the file, so no format lists a case
another omits."""
from __future__ import annotations

import json
from dataclasses import dataclass

from builder.core.records import GateStatus, Report, number

ACCEPTANCE, PLACEMENT = "acceptance", "placement"


@dataclass(frozen=True)
class Case:
    """One test case: a gate, or the .sqsh smoke."""

    suite: str
    name: str
    status: GateStatus
    reason: str
    seconds: float | None
    required: bool
    detail: str  # the evidence as JSON, then the log
    log: str


def suites(report: Report) -> dict[str, list[Case]]:
    """The report's suites in order: acceptance always, placement when a .sqsh was placed."""
    out = {ACCEPTANCE: [Case(ACCEPTANCE, g.name, g.status, g.reason, number(g.evidence.seconds),
                             g.name in report.required_gates,
                             json.dumps(g.evidence.model_dump(mode="json"), indent=1, sort_keys=True)
                             + ("\n" + g.log if g.log else ""), g.log) for g in report.gates]}
    if report.sqsh is not None:
        smoke = report.sqsh.smoke
        status = smoke.get("status", "not_run")
        out[PLACEMENT] = [Case(PLACEMENT, "sqsh_smoke", status if status in ("pass", "fail", "inconclusive", "not_run")
                               else "inconclusive", str(smoke.get("reason", "")), number(smoke.get("seconds")), False,
                               json.dumps(smoke, indent=1, sort_keys=True, default=str), "")]
    return out


def tested(cases: list[Case]) -> dict[str, list[str]]:
    """An in-toto test-result v0.1 predicate's lists of a suite's cases: passed, failed, and warned (inconclusive or
    not run)."""
    return {"passedTests": [c.name for c in cases if c.status == "pass"],
            "failedTests": [c.name for c in cases if c.status == "fail"],
            "warnedTests": [c.name for c in cases if c.status in ("inconclusive", "not_run")]}
