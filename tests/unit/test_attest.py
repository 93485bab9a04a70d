"""Attestations without Docker: DSSE signing, the three statements, verify_test_result, SBOM schema."""
import base64
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import AttestationError, BadInput
from builder.core.records import Report
from builder.lock import record as lock_record
from builder.pins.model import Pins
from builder.release import attest, dsse, sbom
from tests.fixture_types import MakeReportInputs

DIGEST = "sha256:" + "12" * 32
OTHER = "sha256:" + "34" * 32
PINS = Path(__file__).resolve().parents[2] / "pins" / "demo.yaml"
Keys = dict[str, tuple[dsse.PrivateKey, dsse.PublicKey]]
Records = Callable[..., tuple[Pins, Report]]  # keyword overrides as report_inputs takes them


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    d = tmp_path_factory.mktemp("keys")
    dsse.keygen(d / "a.pem", d / "a.pub")
    dsse.keygen(d / "b.pem", d / "b.pub")
    return {k: (dsse.load_private(d / f"{k}.pem"), dsse.load_public(d / f"{k}.pub")) for k in "ab"}


@pytest.fixture
def records(report_inputs: MakeReportInputs) -> Records:
    """A report of pins/demo.yaml whose recorded sha256 is the file's (as a real run records it)."""
    from builder.report import document as report_mod

    def make(**kwargs: Any) -> tuple[Pins, Report]:
        pins, sources, built, result = report_inputs(**kwargs)
        pins._path = PINS  # as pins.load sets it: the lock is found beside the file
        sources = sources.model_copy(update={"pins_path": str(PINS),
                                             "pins_sha256": hashlib.sha256(PINS.read_bytes()).hexdigest()})
        return pins, report_mod.make_report(pins, lock_record.of(pins), sources, built, result)

    return make


MANIFEST = {"components": {"vllm": {"distribution": "tinyengine", "version": "0.2.0", "commit": "a" * 40,
                                    "tree": "b" * 40, "url": "https://example.invalid/tinyengine.git"}},
            "distributions": {"tinyengine": "0.2.0", "torch": "2.13.0+cpu", "packaging": "24.2"}}


def test_keygen_private_key_mode_0600_and_no_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kid = dsse.keygen(tmp_path / "k.pem", tmp_path / "k.pub")
    assert stat.S_IMODE(os.stat(tmp_path / "k.pem").st_mode) == 0o600
    assert len(kid) == 64
    secret = (tmp_path / "k.pem").read_text()
    assert "PRIVATE KEY" in secret and "PUBLIC KEY" in (tmp_path / "k.pub").read_text()
    with pytest.raises(BadInput, match="exists"):
        dsse.keygen(tmp_path / "k.pem", tmp_path / "k2.pub")
    out = capsys.readouterr()
    assert secret.splitlines()[1] not in out.out + out.err


def test_dsse_roundtrip_and_tampering(keys: Keys) -> None:
    priv, pub = keys["a"]
    env = dsse.sign({"x": 1}, priv)
    assert dsse.open_envelope(env, pub) == {"x": 1}
    with pytest.raises(dsse.SignatureError):
        dsse.open_envelope(env, keys["b"][1])
    tampered = dict(env, payload=base64.b64encode(b'{"x":2}').decode())
    with pytest.raises(dsse.SignatureError):
        dsse.open_envelope(tampered, pub)
    with pytest.raises(dsse.SignatureError):
        dsse.open_envelope(dict(env, payloadType="text/plain"), pub)
    assert dsse.pae("ab", b"xyz") == b"DSSEv1 2 ab 3 xyz"


def test_statements_carry_the_required_fields(records: Records) -> None:
    pins, report = records()
    stmts = attest.statements(report, pins, lock_record.of(pins), MANIFEST, "127.0.0.1:5000/demo/unified", DIGEST)
    assert [s["predicateType"] for s in stmts] == list(attest.PREDICATE_TYPES)
    for s in stmts:
        assert s["_type"] == "https://in-toto.io/Statement/v1"
        assert s["subject"] == [{"name": "127.0.0.1:5000/demo/unified", "digest": {"sha256": "12" * 32}}]
    prov = stmts[0]["predicate"]
    bd = prov["buildDefinition"]
    assert bd["buildType"].endswith("@v0.1.0") and bd["externalParameters"]["pins"]["content"] == PINS.read_text()
    deps = {d["name"]: d for d in bd["resolvedDependencies"]}
    for name, comp in report.sources.components.items():
        assert deps[name]["digest"] == {"gitCommit": comp.commit, "gitTree": comp.tree}
    assert deps["base"]["digest"] == {"sha256": "cd" * 32}
    from builder.lock import native

    for item in native.parse(pins.lock_path().read_text()).inputs:  # each native build input, a git commit + tree
        dep = deps[f"native:{item.component}/{item.name}"]
        assert dep["digest"] == {"gitCommit": item.commit, "gitTree": item.tree}
        assert dep["annotations"]["git_tag"] == item.ref and dep["uri"].endswith(f"tinykernels.git@{item.ref}")
    assert "native:vllm/tinykernels" in deps
    locked = lock_record.of(pins).entries
    assert locked, "the demo lock pins wheels"
    for entry in locked:  # every locked wheel, build-only ones included, with its sha256
        assert deps[f"{entry.name}=={entry.version}"]["digest"]["sha256"] == entry.hashes[0]
    rd = prov["runDetails"]
    assert rd["builder"]["version"]["docker-engine"] == "20.10.24"
    assert rd["metadata"]["startedOn"] and rd["metadata"]["finishedOn"]
    result = stmts[2]["predicate"]
    assert result["result"] == "PASSED" and result["passedTests"] == ["provenance", "zero_update", "rl_step", "control",
                                                                          "performance"]
    assert [c["name"] for c in result["configuration"]] == ["demo.yaml", "recipe"]


def test_test_result_failed_unless_accepted_and_warned_gates(records: Records) -> None:
    pins, report = records(statuses={"control": "inconclusive", "rl_step": None})
    assert report.verdict == "NOT ACCEPTED"
    pred = attest.test_result(report, pins, PINS.read_bytes())
    assert pred["result"] == "FAILED"
    assert sorted(pred["warnedTests"]) == ["control", "rl_step"] and pred["failedTests"] == []


def test_pins_changed_since_the_run_is_refused(records: Records, tmp_path: Path) -> None:
    from builder.core.errors import PublishError

    pins, report = records()
    copy = tmp_path / "demo.yaml"
    copy.write_text(PINS.read_text() + "# edited\n")
    report = report.model_copy(update={"sources": report.sources.model_copy(update={"pins_path": str(copy)})})
    with pytest.raises(PublishError, match="changed since the run"):
        attest.pins_bytes(report)


def test_verify_test_result_names_the_failed_check(records: Records, keys: Keys) -> None:
    pins, report = records()
    priv, pub = keys["a"]
    stmt = attest.statements(report, pins, lock_record.of(pins), MANIFEST, "r", DIGEST)[2]
    assert attest.verify_test_result(dsse.sign(stmt, priv), pub, DIGEST)["result"] == "PASSED"
    cases = {"signature": (dsse.sign(stmt, keys["b"][0]), DIGEST), "subject": (dsse.sign(stmt, priv), OTHER)}
    failed = json.loads(json.dumps(stmt))
    failed["predicate"]["result"] = "FAILED"
    cases["test result"] = (dsse.sign(failed, priv), DIGEST)
    for check, (env, digest) in cases.items():
        with pytest.raises(AttestationError) as err:
            attest.verify_test_result(env, pub, digest)
        assert err.value.check == check


def test_sbom_is_valid_cyclonedx_1_6_and_carries_commits() -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    bom = sbom.build(MANIFEST, "127.0.0.1:5000/demo/unified", DIGEST)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(bom)) is None
    assert bom["specVersion"] == "1.6"
    got = sbom.covered(bom)
    assert set(got) == {"tinyengine", "torch", "packaging"}
    assert got["tinyengine"]["commit"] == "a" * 40 and got["torch"]["commit"] is None


def test_no_key_means_not_attested(capsys: pytest.CaptureFixture[str]) -> None:
    assert attest.signer(None) is None
    assert "not attested" in capsys.readouterr().err


# ---------------------------------------------------------------- the signed acceptance result publish requires


def signed_run(records: Records, keys: Keys, tmp_path: Path, signer: str = "a", **kwargs: Any) -> tuple[Report, Path]:
    from builder.report import document as report_mod

    pins, report = records(**kwargs)
    paths = report_mod.write(report, tmp_path)
    attest.sign_acceptance(report, pins, keys[signer][0], tmp_path)
    return report, paths["json"]


def test_signed_acceptance_result_lets_publish_go_on(records: Records, keys: Keys, tmp_path: Path) -> None:
    from builder.release import publish

    report, path = signed_run(records, keys, tmp_path)
    assert report.verdict == "ACCEPTED"
    publish.check_signed_acceptance(report, path, keys["a"][0], str(path))  # no error
    publish.check_signed_acceptance(report, path, None, str(path))         # no key: signing not set up


@pytest.mark.parametrize("tamper", ["another key", "missing", "another image", "edited report", "not accepted"])
def test_publish_refuses_without_a_valid_signed_acceptance(records: Records, keys: Keys, tmp_path: Path, tamper: str) -> None:
    from builder.core.errors import PublishError
    from builder.release import publish

    report, path = signed_run(records, keys, tmp_path, signer="b" if tamper == "another key" else "a",
                              **({"statuses": {"rl_step": "fail"}} if tamper in ("edited report", "not accepted")
                                 else {}))
    envelope = path.parent / attest.ACCEPTANCE_ENVELOPE
    if tamper == "missing":
        envelope.unlink()
    if tamper == "another image":
        report = report.model_copy(update={"image_id": OTHER})
    if tamper == "edited report":  # the report.json says pass now; the signature says what acceptance saw
        gates = [g.model_copy(update={"status": "pass"}) for g in report.gates]
        report = report.model_copy(update={"gates": gates, "verdict": "ACCEPTED", "reasons": []})
    with pytest.raises((PublishError, BadInput)) as err:
        publish.check_signed_acceptance(report, path, keys["a"][0], str(path))
    assert str(path) in str(err.value)
    expected = {"another key": "signature", "missing": "no signed acceptance result", "another image": "subject",
                "edited report": "FAILED", "not accepted": "FAILED"}[tamper]
    assert expected in str(err.value), str(err.value)


# ---- the attestations and labels as the specs type them (independent validators)

RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def spec_problems(stmts: list[dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """What the in-toto Statement/SLSA v1/test-result protos (strict), CycloneDX 1.6 strict, RFC 3986 and RFC 3339
    say is wrong with the three statements and the image labels; [] when nothing."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
    from in_toto_attestation.v1 import statement_pb2
    from rfc3986 import uri_reference, validators

    problems: list[str] = []
    uri = validators.Validator().require_presence_of("scheme").check_validity_of("scheme", "host", "path", "query",
                                                                                 "fragment")

    def check_uri(where: str, value: str) -> None:
        try:
            uri.validate(uri_reference(value))
        except Exception as exc:  # the validator's own error types
            problems.append(f"{where}: {value!r} is not an RFC 3986 URI ({type(exc).__name__})")

    protos = {attest.PROVENANCE_TYPE: provenance_pb2.Provenance, attest.TEST_RESULT_TYPE: test_result_pb2.TestResult}
    for stmt in stmts:
        try:
            json_format.ParseDict(stmt, statement_pb2.Statement(), ignore_unknown_fields=False)
            if stmt["predicateType"] in protos:
                json_format.ParseDict(stmt["predicate"], protos[stmt["predicateType"]](), ignore_unknown_fields=False)
        except json_format.ParseError as exc:
            problems.append(f"{stmt['predicateType']}: {exc}")
        if stmt["predicateType"] == attest.SBOM_TYPE:
            error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(stmt["predicate"]))
            if error is not None:
                problems.append(f"sbom: {error}")
        if stmt["predicateType"] == attest.PROVENANCE_TYPE:
            for dep in stmt["predicate"]["buildDefinition"]["resolvedDependencies"]:
                check_uri(f"resolvedDependencies[{dep['name']}].uri", dep["uri"])
            for key, value in stmt["predicate"]["runDetails"]["metadata"].items():
                if key.endswith("On") and not RFC3339_UTC.fullmatch(value):
                    problems.append(f"runDetails.metadata.{key}: {value!r} is not RFC 3339 UTC with Z")
    if "org.opencontainers.image.source" in labels:
        check_uri("label org.opencontainers.image.source", labels["org.opencontainers.image.source"])
    if not RFC3339_UTC.fullmatch(labels["org.opencontainers.image.created"]):
        problems.append("label org.opencontainers.image.created is not RFC 3339 UTC")
    return problems


def _statements_and_labels(records: Records) -> tuple[list[dict[str, Any]], dict[str, str]]:
    from builder.image import render

    pins, rep = records()
    stmts = attest.statements(rep, pins, lock_record.of(pins), MANIFEST, "127.0.0.1:5000/demo/unified", DIGEST)
    return stmts, render.labels(pins, rep.sources)


def test_attestations_and_labels_pass_the_independent_validators(records: Records) -> None:
    stmts, labels = _statements_and_labels(records)
    assert spec_problems(stmts, labels) == []
    prov = stmts[0]["predicate"]
    uris = [d["uri"] for d in prov["buildDefinition"]["resolvedDependencies"]]
    assert any(u.startswith("git+file:///") and u.endswith("@refs/pull/11/head") for u in uris), uris
    assert prov["runDetails"]["metadata"]["startedOn"] == "2026-11-01T00:00:00Z"


@pytest.mark.parametrize("plant", ["scheme-less uri", "offset timestamp", "number for a string", "source label"])
def test_a_field_of_the_wrong_type_fails_the_validators(records: Records, plant: str) -> None:
    stmts, labels = _statements_and_labels(records)
    prov = stmts[0]["predicate"]
    if plant == "scheme-less uri":
        prov["buildDefinition"]["resolvedDependencies"][0]["uri"] = "git+/abs/path/tinyengine.git@refs/pull/11/head"
    elif plant == "offset timestamp":
        prov["runDetails"]["metadata"]["startedOn"] = "2026-12-04T04:28:56+00:00"
    elif plant == "number for a string":
        stmts[2]["predicate"]["passedTests"] = [1]
    else:
        labels["org.opencontainers.image.source"] = "demo-stack/tinyrl.git"
    assert spec_problems(stmts, labels) != []


def test_an_index_pinned_base_records_both_digests_outside_the_image(records: Records) -> None:
    """The provenance's base dependency is the platform manifest the build used; the pinned index and the platform
    are its annotations (the report's container layer and build record carry both too)."""
    from builder.report import manifest as manifest_layers

    pins, report = records()
    assert report.build is not None
    index, platform_digest = "sha256:" + "1e" * 32, "sha256:" + "ab" * 32
    build = report.build.model_copy(update={"base_digest": platform_digest, "base_index_digest": index})
    report = report.model_copy(update={"build": build})
    stmts = attest.statements(report, pins, lock_record.of(pins), MANIFEST, "127.0.0.1:5000/demo/unified", DIGEST)
    base = {d["name"]: d for d in stmts[0]["predicate"]["buildDefinition"]["resolvedDependencies"]}["base"]
    assert base["digest"] == {"sha256": "ab" * 32}  # not the pinned digest
    assert base["annotations"] == {"index_digest": index, "platform": pins.base.platform}
    layer = manifest_layers.container_layer(pins, build, None, None)
    assert (layer["base_digest"], layer["base_index_digest"]) == (platform_digest, index)
