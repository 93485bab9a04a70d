"""Three signed in-toto Statements v1 bound to the published image manifest digest:
SLSA provenance v1, a CycloneDX 1.6 SBOM and an in-toto test result v0.1.

`statements(...)` builds them from the run's records (no network); `attach_all(...)` signs each into a
DSSE envelope and attaches it to the image in the registry (builder/release/referrers.py).
`verify_test_result(...)` checks one signed test result: the acceptance verdict as signed evidence.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from builder.core import files as fs
from builder.core import log
from builder.core.constants import BUILDER_VERSION, TOOL_URI
from builder.core.errors import AttestationError, PublishError
from builder.core.imageref import ImageRef, Repository, hex_of
from builder.core.records import Report
from builder.engine.registry import Registry, parse_repository
from builder.lock.record import Lock
from builder.pins.model import Pins
from builder.release import dsse, referrers, sbom
from builder.report import results
from builder.sources.resolve import absolute_url

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
TEST_RESULT_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
SBOM_TYPE = sbom.PREDICATE_TYPE
PREDICATE_TYPES = (PROVENANCE_TYPE, SBOM_TYPE, TEST_RESULT_TYPE)
BUILD_TYPE = f"{TOOL_URI}/unified-image@v{BUILDER_VERSION}"
BUILDER_ID = f"{TOOL_URI}/builder/local"


def statement(repository: str, digest: str, predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    return {"_type": STATEMENT_TYPE, "subject": [{"name": repository, "digest": {"sha256": hex_of(digest)}}],
            "predicateType": predicate_type, "predicate": predicate}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pins_bytes(report: Report) -> bytes:
    """The pins file the run used, checked against the sha256 the run recorded."""
    path = Path(report.sources.pins_path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PublishError(f"{path}: cannot read the pins file to attest: {exc.strerror}") from None
    if _sha256(data) != report.sources.pins_sha256:
        raise PublishError(f"{path}: changed since the run (sha256 {_sha256(data)}, the run used "
                           f"{report.sources.pins_sha256}); refusing to attest")
    return data


def lock_of_run(report: Report, lock: Lock) -> Lock:
    """The lock the run used: its sha256 is the one the report recorded, else PublishError."""
    if lock.sha256 != report.lock_sha256:
        raise PublishError(f"{lock.path}: changed since the run (sha256 {lock.sha256}, the run used "
                           f"{report.lock_sha256}); refusing to attest")
    return lock


def locked_wheels(lock: Lock) -> list[dict[str, Any]]:
    """One resolved dependency per locked distribution hash."""
    out = []
    for entry in lock.entries:
        for digest in entry.hashes:
            out.append({"name": f"{entry.name}=={entry.version}",
                        "uri": f"pkg:pypi/{sbom.canonical(entry.name)}@{entry.version}", "digest": {"sha256": digest}})
    return out


def git_uri(remote: str, ref: str) -> str:
    """An RFC 3986 URI for a git remote at a ref (SPDX download location style): `git+https://...@ref`,
    `git+ssh://...`, and `git+file:///abs/path@ref` for a path (a building machine's path belongs in the
    provenance, which records where the sources came from; never in the image)."""
    parts = urlsplit(remote)
    if parts.scheme and parts.scheme != "file" and len(parts.scheme) > 1:
        return f"git+{remote}@{ref}"
    scp = re.fullmatch(r"([\w.-]+@)?([\w.-]+):(?!//)(.+)", remote)
    if scp and not parts.scheme:
        return f"git+ssh://{scp.group(1) or ''}{scp.group(2)}/{scp.group(3).lstrip('/')}@{ref}"
    path = Path(parts.path if parts.scheme == "file" else remote)
    return f"git+{quote(path.absolute().as_uri(), safe=':/%')}@{ref}"


def utc_timestamp(text: str) -> str:
    """An in-toto Timestamp: RFC 3339 in UTC with `Z` (a naive time is read as UTC)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def native_inputs(pins: Pins, lock: Lock) -> list[dict[str, Any]]:
    """One resolved dependency per native build input the lock names (a git commit and tree)."""
    return [{"name": f"native:{i.component}/{i.name}",
             "uri": git_uri(absolute_url(i.url, pins.component_url(i.component)), i.ref),
             "digest": {"gitCommit": i.commit, "gitTree": i.tree},
             "annotations": {"component": i.component, "git_tag": i.ref, "declared": i.declared,
                             "received_as": i.receive, "export_sha256": i.export_sha256}}
            for i in lock.native.inputs]


def provenance(report: Report, pins: Pins, lock: Lock, pins_data: bytes) -> dict[str, Any]:
    """SLSA provenance v1 predicate."""
    lock = lock_of_run(report, lock)
    deps = [{"name": name, "uri": git_uri(c.url, f"refs/pull/{c.pr}/head"),
             "digest": {"gitCommit": c.commit, "gitTree": c.tree},
             "annotations": {"pr": c.pr, "target": c.target, "merge_base": c.merge_base,
                             "export_sha256": c.export_sha256}}
            for name, c in report.sources.components.items()]
    base = ImageRef(pins.base.image)
    build = report.build
    platform_digest = build.base_digest if build and build.base_digest else str(base.digest)
    index = build.base_index_digest if build else None  # an index pinned: both digests recorded, the build used this
    deps.append({"name": "base", "uri": f"oci://{base.name}", "digest": {"sha256": hex_of(platform_digest)},
                 **({"annotations": {"index_digest": index, "platform": pins.base.platform}} if index else {})})
    deps += native_inputs(pins, lock)
    deps += locked_wheels(lock)
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"pins": {"path": Path(report.sources.pins_path).name,
                                            "sha256": report.sources.pins_sha256,
                                            "content": pins_data.decode()},
                                   "lock": {"path": lock.path.name, "sha256": lock.sha256}},
            "internalParameters": {"dockerfile_sha256": build.dockerfile_sha256 if build else "unknown",
                                   "context_sha256": build.context_sha256 if build else "unknown"},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID, "version": {"rl-image-builder": BUILDER_VERSION,
                                                      "docker-engine": build.engine_version if build else "unknown"}},
            "metadata": {"invocationId": f"{report.name}@{report.created}",
                         "startedOn": utc_timestamp(report.sources.resolved_at),
                         "finishedOn": utc_timestamp(report.created)},
            "byproducts": [{"name": "image-config", "digest": {"sha256": hex_of(report.image_id)}}],
        },
    }


def test_result(report: Report, pins: Pins, pins_data: bytes) -> dict[str, Any]:
    """in-toto test-result v0.1: PASSED only for ACCEPTED; inconclusive and not run count as warned. Its tests
    are the acceptance suite of results.suites, the list junit.xml and ctrf.json are written from: it is signed at
    acceptance, before a .sqsh is placed; the placement suite (sqsh_smoke) has a statement of its own
    (placement_statement)."""
    recipe = json.dumps(pins.recipe.model_dump(mode="json"), sort_keys=True).encode()
    return {
        "result": "PASSED" if report.verdict == "ACCEPTED" else "FAILED",
        "configuration": [
            {"name": Path(report.sources.pins_path).name, "digest": {"sha256": _sha256(pins_data)},
             "content": base64.b64encode(pins_data).decode()},
            {"name": "recipe", "digest": {"sha256": _sha256(recipe)}, "content": base64.b64encode(recipe).decode(),
             "mediaType": "application/json"},
        ],
        **results.tested(results.suites(report)[results.ACCEPTANCE]),
    }


def placement_statement(report: Report) -> dict[str, Any] | None:
    """The in-toto test result of the placement suite (sqsh_smoke), over the .sqsh file (its name and sha256): made
    when the .sqsh is placed beside the registry digest or exported, after the acceptance result was signed. FAILED
    when the smoke failed, WARNED when it did not run (the cluster gates ran on the file) or was inconclusive.
    None before a .sqsh is recorded."""
    cases = results.suites(report).get(results.PLACEMENT)
    if report.sqsh is None or not cases:
        return None
    listed = results.tested(cases)
    verdict = "FAILED" if listed["failedTests"] else "WARNED" if listed["warnedTests"] else "PASSED"
    subject = [{"name": Path(report.sqsh.pointer or report.sqsh.path).name, "digest": {"sha256": report.sqsh.sha256}}]
    return {"_type": STATEMENT_TYPE, "subject": subject, "predicateType": TEST_RESULT_TYPE,
            "predicate": {"result": verdict, "configuration": [
                {"name": Path(report.sources.pins_path).name, "digest": {"sha256": report.sources.pins_sha256}},
                {"name": "image", "digest": {"sha256": hex_of(report.image_id)}}], **listed}}


def statements(report: Report, pins: Pins, lock: Lock, image_manifest: dict[str, Any], repository: str,
               digest: str) -> list[dict[str, Any]]:
    pins_data = pins_bytes(report)
    return [statement(repository, digest, PROVENANCE_TYPE, provenance(report, pins, lock, pins_data)),
            statement(repository, digest, SBOM_TYPE, sbom.build(image_manifest, repository, digest)),
            statement(repository, digest, TEST_RESULT_TYPE, test_result(report, pins, pins_data))]


ACCEPTANCE_ENVELOPE = "acceptance.dsse.json"  # beside report.json: the signed test result over the image ID


def sign_acceptance(report: Report, pins: Pins, key: dsse.PrivateKey, run_dir: Path) -> Path:
    """At acceptance time: the in-toto test result, subject = the accepted image's config digest (its ID),
    DSSE-signed; publish requires it (and a matching key) before any release tag."""
    stmt = statement(report.repository, report.image_id, TEST_RESULT_TYPE, test_result(report, pins, pins_bytes(report)))
    path = run_dir / ACCEPTANCE_ENVELOPE
    fs.write_atomic(path, json.dumps(dsse.sign(stmt, key), sort_keys=True, indent=2) + "\n")
    log.info(f"signed the acceptance result of {report.image_id[:19]} (key {dsse.key_id(key.public_key())[:16]}): {path}")
    return path


PLACEMENT_ENVELOPE = "placement.dsse.json"  # beside report.json: the signed test result of the placed .sqsh


def sign_placement(report: Report, key: dsse.PrivateKey, run_dir: Path) -> Path | None:
    """Once a .sqsh is in the report: its placement statement DSSE-signed beside the report (None: no .sqsh)."""
    stmt = placement_statement(report)
    if stmt is None:
        return None
    path = run_dir / PLACEMENT_ENVELOPE
    fs.write_atomic(path, json.dumps(dsse.sign(stmt, key), sort_keys=True, indent=2) + "\n")
    log.info(f"signed the placement result of {stmt['subject'][0]['name']} ({stmt['predicate']['result']}): {path}")
    return path


def signer(key_path: Path | None, passphrase: str | None = None) -> dsse.PrivateKey | None:
    """The signing key, loaded before anything is pushed (BadInput when unreadable); None: say so."""
    if key_path is None:
        log.info("not attested: no signing key (--key or BUILDER_SIGNING_KEY); `builder verify` will fail")
        return None
    return dsse.load_private(key_path, passphrase)


def attach_all(report: Report, pins: Pins, lock: Lock, repository: Repository | str, digest: str, image_manifest: dict[str, Any],
               key: dsse.PrivateKey, registry: Registry, once: bool = False,
               note: referrers.Note | None = None) -> list[dict[str, Any]]:
    """Sign the three statements and attach them to repository@digest; returns the artifact descriptors.
    Idempotent per key: a statement this key already attached to the digest (equal apart from its timestamps,
    see `stable`) is not attached again; with `once`, nothing is attached when the key already attached all
    three predicate types (a nightly on an unchanged digest).  On a failed push the artifacts already pushed
    are deleted and PublishError is raised. `note(kind, value)` hears of each upload session and artifact before
    it is written (the publish journal)."""
    name = parse_repository(repository).path  # a Repository passes as it is; a caller's text is parsed
    kid = dsse.key_id(key.public_key())[:16]
    existing = attached_by(registry, name, digest, key.public_key())
    if once and {t for t, _ in existing.values()} >= set(PREDICATE_TYPES):
        log.info(f"already attested {repository}@{digest} (key {kid}): attached nothing new")
        return [d for _, d in existing.values()]
    served = registry.manifest(name, digest)
    subject = {"mediaType": served["media_type"], "digest": digest, "size": len(served["content"])}
    todo, kept = [], []
    for stmt in statements(report, pins, lock, image_manifest, repository, digest):
        same = existing.get(stable(stmt))
        if same:
            kept.append(same[1])
        else:
            todo.append((stmt["predicateType"], json.dumps(dsse.sign(stmt, key), sort_keys=True).encode()))
    pushed: list[dict[str, Any]] = []
    try:
        for predicate_type, envelope in todo:
            pushed.append(referrers.attach(registry, name, subject, envelope, predicate_type, note))
    except PublishError:
        for desc in pushed:
            registry.delete_manifest(name, desc["digest"])
        raise
    if kept:
        log.info(f"already attested {repository}@{digest} (key {kid}): " + ", ".join(_short(d) for d in kept))
    log.info(f"attested {repository}@{digest}: " + (", ".join(_short(d) for d in pushed) or "nothing new")
             + f" (key {kid})")
    return kept + pushed


def _short(desc: dict[str, Any]) -> str:
    return f"{desc['annotations'][referrers.PREDICATE_ANNOTATION].rsplit('/', 2)[-2]} {desc['digest'][:19]}"


# Fields that change with every signing though the claim is the same: the provenance's run metadata (invocation
# ID and times) and the SBOM's timestamp and random serial number.
VOLATILE = {PROVENANCE_TYPE: (("runDetails", "metadata"),), SBOM_TYPE: (("serialNumber",), ("metadata", "timestamp"))}


def stable(stmt: dict[str, Any]) -> bytes:
    """The statement's bytes without its volatile fields: equal for a re-publish of the same claim."""
    copy = json.loads(json.dumps(stmt))
    for path in VOLATILE.get(copy.get("predicateType"), ()):
        node = copy.get("predicate")
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return json.dumps(copy, sort_keys=True, separators=(",", ":")).encode()


def attached_by(registry: Registry, name: str, digest: str,
                public_key: dsse.PublicKey) -> dict[bytes, tuple[str, dict[str, Any]]]:
    """{stable statement: (predicate type, descriptor)} of the envelopes `public_key` signed for `digest`
    that are attached to it; unreadable envelopes and others' envelopes are passed over."""
    out: dict[bytes, tuple[str, dict[str, Any]]] = {}
    for desc in referrers.discover(registry, name, digest):
        try:
            stmt = open_statement(referrers.fetch_envelope(registry, name, desc)[1], public_key, digest)
        except (PublishError, AttestationError, ValueError):
            continue
        out.setdefault(stable(stmt), (str(stmt.get("predicateType")), desc))
    return out


# ---------------------------------------------------------------- checks shared with builder verify


def open_statement(envelope: dict[str, Any], public_key: dsse.PublicKey, digest: str,
                   subject: bool = True) -> dict[str, Any]:
    """The statement of a signed envelope whose subject is `digest` (not checked with subject=False);
    AttestationError naming the check."""
    try:
        stmt = dsse.open_envelope(envelope, public_key)
    except dsse.SignatureError as exc:
        raise AttestationError("signature", str(exc)) from None
    if stmt.get("_type") != STATEMENT_TYPE:
        raise AttestationError("statement", f"_type {stmt.get('_type')!r}, expected {STATEMENT_TYPE}")
    if not subject:
        return stmt
    hexpart = hex_of(digest)
    subjects = [s.get("digest", {}).get("sha256") for s in stmt.get("subject") or []]
    if not subjects or any(s != hexpart for s in subjects):
        got = ", ".join(f"sha256:{s}" for s in subjects) or "none"
        raise AttestationError("subject", f"{stmt.get('predicateType')} is for {got}, not {digest}")
    return stmt


def verify_test_result(envelope: dict[str, Any], public_key: dsse.PublicKey, digest: str) -> dict[str, Any]:
    """A signed in-toto test result for `digest` that reads PASSED; returns its predicate.
    Raises AttestationError('signature' | 'subject' | 'statement' | 'test result', ...)."""
    stmt = open_statement(envelope, public_key, digest)
    if stmt.get("predicateType") != TEST_RESULT_TYPE:
        raise AttestationError("statement", f"predicateType {stmt.get('predicateType')!r}, expected {TEST_RESULT_TYPE}")
    pred: dict[str, Any] = stmt.get("predicate") or {}
    if pred.get("result") != "PASSED":
        raise AttestationError("test result", f"result is {pred.get('result')!r} (failed: "
                               f"{', '.join(pred.get('failedTests') or []) or 'none'}; warned: "
                               f"{', '.join(pred.get('warnedTests') or []) or 'none'}), expected PASSED")
    return pred


