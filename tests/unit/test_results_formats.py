"""One run, one list of tests: junit.xml, ctrf.json and the in-toto test results list the same cases in the same
suites (acceptance: the gates; placement: sqsh_smoke once a .sqsh is placed), with the same statuses, because all
are written from builder/report/results.py. The in-toto result is one statement per suite: the acceptance one
(signed at acceptance), the placement one (signed at placement, attest.sign_placement). Each file is valid on its own
against its format's schema: Jenkins' JUnit XSD and the CTRF JSON schema (tests/data/schemas, sources noted there)."""
from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import xmlschema
from cryptography.hazmat.primitives.asymmetric import ed25519

from builder.core.records import Report, SqshExport
from builder.lock import record as lock_record
from builder.release import attest, dsse
from builder.report import document, results
from builder.report.ctrf import STATUS, to_ctrf
from tests.fixture_types import MakeReportInputs

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"

JUNIT = {"failure": "fail", "error": "inconclusive", "skipped": "not_run", "system-out": "pass"}
CLUSTER_SMOKE = {"status": "not_run", "reason": "the cluster gates ran on this file"}


def _report(report_inputs: MakeReportInputs, sqsh: bool) -> tuple[Report, Any]:
    pins, sources, built, result = report_inputs(statuses={"rl_step": "fail", "control": "inconclusive"})
    report = document.make_report(pins, lock_record.of(pins), sources, built, result)
    if sqsh:
        placed = SqshExport(path="/x.sqsh", sha256="5" * 64, size=1, compression="-comp lzo -noD",
                            mksquashfs="mksquashfs version 4.5.1", mksquashfs_args=[], image_id=report.image_id,
                            tag="TAG", registry_digest="sha256:" + "9" * 64, entries=10, files=8, xattrs=False,
                            enroot_files={}, equivalence="pass", smoke=CLUSTER_SMOKE, seconds={},
                            created="2026-11-29T00:00:00Z")
        report = report.model_copy(update={"sqsh": placed})
    return report, pins


def _junit(report: Report) -> list[tuple[str, str, str]]:
    root = ET.fromstring(document.to_junit(report))
    out = []
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            kind = next(child.tag for child in case if child.tag in JUNIT)
            out.append((str(suite.get("name")), str(case.get("name")), JUNIT[kind]))
    assert root.get("tests") == str(len(out))
    return out


def _ctrf(report: Report) -> list[tuple[str, str, str]]:
    tests = to_ctrf(report)["results"]["tests"]
    assert all(STATUS[t["extra"]["builder_status"]] == t["status"] for t in tests)
    return [(t["suite"][0], t["name"], t["extra"]["builder_status"]) for t in tests]


INTOTO = {"passedTests": "pass", "failedTests": "fail", "warnedTests": "warned"}


def _intoto(report: Report, pins: Any) -> list[tuple[str, str, str]]:
    """Every case of the in-toto test results: the acceptance statement's, then the placement statement's."""
    predicates = [(results.ACCEPTANCE, attest.test_result(report, pins, b"pins"))]
    placed = attest.placement_statement(report)
    if placed is not None:
        predicates.append((results.PLACEMENT, placed["predicate"]))
    return [(suite, name, INTOTO[key]) for suite, predicate in predicates for key in INTOTO
            for name in predicate[key]]


def test_every_format_lists_the_same_cases(report_inputs: MakeReportInputs) -> None:
    for sqsh in (False, True):
        report, pins = _report(report_inputs, sqsh)
        listed = [(c.suite, c.name, c.status) for cases in results.suites(report).values() for c in cases]
        assert _junit(report) == _ctrf(report) == listed
        warned = sorted((s, n, "warned" if st in ("inconclusive", "not_run") else st) for s, n, st in listed)
        assert sorted(_intoto(report, pins)) == warned
    assert listed[-1] == ("placement", "sqsh_smoke", "not_run") and len(listed) == 6
    placed = attest.placement_statement(report)
    assert placed is not None and placed["subject"] == [{"name": "x.sqsh", "digest": {"sha256": "5" * 64}}]
    assert placed["predicate"]["result"] == "WARNED"  # the cluster gates ran on the file: its smoke did not run


def test_the_placement_result_is_signed_over_the_sqsh(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    report, _ = _report(report_inputs, sqsh=True)
    key = ed25519.Ed25519PrivateKey.generate()
    path = attest.sign_placement(report, key, tmp_path)
    assert path == tmp_path / attest.PLACEMENT_ENVELOPE
    stmt = dsse.open_envelope(json.loads(path.read_text()), key.public_key())
    assert stmt == attest.placement_statement(report) and stmt["predicate"]["warnedTests"] == ["sqsh_smoke"]
    bare, _ = _report(report_inputs, sqsh=False)
    assert attest.sign_placement(bare, key, tmp_path / "none") is None  # no .sqsh: no statement, no file


def test_a_case_left_out_of_the_signed_results_is_caught(report_inputs: MakeReportInputs, monkeypatch: Any) -> None:
    """The comparison can fail: without the placement statement (as before) sqsh_smoke is in junit.xml only."""
    report, pins = _report(report_inputs, sqsh=True)
    monkeypatch.setattr(attest, "placement_statement", lambda r: None)
    assert [c[1] for c in _junit(report)] != [c[1] for c in sorted(_intoto(report, pins))]
    assert "sqsh_smoke" not in [c[1] for c in _intoto(report, pins)]


@pytest.fixture(scope="module")
def junit_xsd() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd"))


@pytest.fixture(scope="module")
def ctrf_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / "ctrf.schema.json").read_text())
    return schema


def test_junit_xml_is_valid_against_jenkins_junit_xsd(report_inputs: MakeReportInputs,
                                                      junit_xsd: xmlschema.XMLSchema) -> None:
    for sqsh in (False, True):
        report, _ = _report(report_inputs, sqsh)
        junit_xsd.validate(document.to_junit(report))
    planted = ET.fromstring(document.to_junit(report))  # the root's skipped count (written until the XSD was
    planted.set("skipped", "1")                         # checked): the XSD refuses it
    with pytest.raises(xmlschema.XMLSchemaValidationError, match="skipped"):
        junit_xsd.validate(ET.tostring(planted, encoding="unicode"))


def test_ctrf_json_is_valid_against_the_ctrf_schema(report_inputs: MakeReportInputs,
                                                    ctrf_schema: dict[str, Any]) -> None:
    for sqsh in (False, True):
        report, _ = _report(report_inputs, sqsh)
        jsonschema.validate(to_ctrf(report), ctrf_schema)
    planted = copy.deepcopy(to_ctrf(report))  # the builder's own status word, not a CTRF one: the schema refuses it
    planted["results"]["tests"][0]["status"] = "inconclusive"
    with pytest.raises(jsonschema.ValidationError, match="inconclusive"):
        jsonschema.validate(planted, ctrf_schema)


def test_a_case_left_out_of_one_format_is_caught(report_inputs: MakeReportInputs, monkeypatch: Any) -> None:
    """The comparison can fail: CTRF written from the gates alone (as before) misses the placement suite."""
    report, _ = _report(report_inputs, sqsh=True)
    real = results.suites
    monkeypatch.setattr(results, "suites", lambda r: {results.ACCEPTANCE: real(r)[results.ACCEPTANCE]})
    ctrf = _ctrf(report)
    monkeypatch.undo()
    assert _junit(report) != ctrf


def test_the_placement_statement_passes_the_in_toto_validators(report_inputs: MakeReportInputs) -> None:
    """Valid on its own too: the in-toto Statement v1 and test-result v0.1 protos (strict), as tests/unit/test_attest.py
    checks the acceptance statement; a number where a test name goes is refused."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
    from in_toto_attestation.v1 import statement_pb2

    report, _ = _report(report_inputs, sqsh=True)
    stmt = attest.placement_statement(report)
    assert stmt is not None
    json_format.ParseDict(stmt, statement_pb2.Statement(), ignore_unknown_fields=False)
    json_format.ParseDict(stmt["predicate"], test_result_pb2.TestResult(), ignore_unknown_fields=False)
    stmt["predicate"]["warnedTests"] = [1]
    with pytest.raises(json_format.ParseError):
        json_format.ParseDict(stmt["predicate"], test_result_pb2.TestResult(), ignore_unknown_fields=False)
