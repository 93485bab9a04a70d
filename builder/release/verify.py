"""`builder verify REPO@sha256:... --key PUB`: find the image's attestations in the registry and check them.

Checks, in order (the first that fails is named): attestations present, every signature, every subject
equal to the digest, the three predicate types present, a test result of PASSED, provenance commits
equal to the image's labels and its /opt/delivery/manifest.json, an SBOM covering every distribution
in that manifest.  Everything is read from the registry, nothing from the local engine.
"""
from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from builder.core.constants import LABEL_PREFIX, MANIFEST
from builder.core.errors import AttestationError, BadInput, PublishError
from builder.core.imageref import ImageRef
from builder.core.options import Settings
from builder.core.safetext import show
from builder.engine.registry import Registry
from builder.release import dsse, referrers, sbom
from builder.release.attest import (
    PREDICATE_TYPES,
    PROVENANCE_TYPE,
    SBOM_TYPE,
    TEST_RESULT_TYPE,
    open_statement,
    verify_test_result,
)

MANIFEST_PATH = MANIFEST.lstrip("/")


@dataclass
class Outcome:
    reference: str
    passed: list[str] = field(default_factory=list)
    attestations: list[dict] = field(default_factory=list)


def parse_reference(ref: str) -> tuple[str, str, str]:
    """'host/name@sha256:<hex>' -> (host, name, digest)."""
    try:
        image = ImageRef(ref, need_domain=True, need_digest=True)
    except ValueError as exc:
        raise BadInput(f"{show(ref, 120)}: expected REPOSITORY@sha256:<64 hex> ({exc})") from None
    return image.registry, image.repository, str(image.digest)


def image_facts(reg: Registry, name: str, digest: str) -> tuple[dict, dict]:
    """(labels, /opt/delivery/manifest.json) of the image, read from its config blob and layers."""
    got = reg.manifest(name, digest)
    if got["computed"] != digest:
        raise AttestationError("image", f"registry serves {got['computed']} for {digest}")
    manifest = json.loads(got["content"])
    if "config" not in manifest:
        raise AttestationError("image", f"{digest} is {manifest.get('mediaType')}, not an image manifest")
    config = json.loads(reg.blob(name, manifest["config"]["digest"]))
    labels = (config.get("config") or {}).get("Labels") or {}
    for layer in reversed(manifest.get("layers") or []):  # the delivery manifest is in a late layer
        found = _file_in_layer(reg, name, layer["digest"], MANIFEST_PATH)
        if found is not None:
            return labels, json.loads(found)
    raise AttestationError("image", f"no /{MANIFEST_PATH} in the layers of {digest}")


def _file_in_layer(reg: Registry, name: str, digest: str, path: str) -> bytes | None:
    resp = reg._request("GET", f"/v2/{name}/blobs/{digest}", stream=True)
    if resp.status_code != 200:
        raise PublishError(f"registry {reg.host}: GET blob {digest} answered {resp.status_code}")
    with resp, tarfile.open(fileobj=resp.raw, mode="r|*") as tar:
        for member in tar:
            if member.name.lstrip("./") == path and member.isfile():
                handle = tar.extractfile(member)
                return handle.read() if handle else None
    return None


def verify(ref: str, public_key: Ed25519PublicKey, settings: Settings) -> Outcome:
    """Run every check; AttestationError names the first that fails."""
    host, name, digest = parse_reference(ref)
    reg = Registry.from_settings(host, settings)
    reg.ping()
    out = Outcome(reference=ref)
    found = referrers.discover(reg, name, digest)
    if not found:
        raise AttestationError("attestations", f"no attestations refer to {ref}")
    out.passed.append(f"attestations: {len(found)} found")
    envelopes = [referrers.fetch_envelope(reg, name, d)[1] for d in found]
    for env in envelopes:  # every attestation must verify: all signatures first, then all subjects
        try:
            dsse.open_envelope(env, public_key)
        except dsse.SignatureError as exc:
            raise AttestationError("signature", str(exc)) from None
    stmts = [open_statement(env, public_key, digest) for env in envelopes]
    out.passed.append(f"signature: {len(stmts)} envelopes verify")
    out.passed.append(f"subject: every statement is for {digest}")
    by_type: dict[str, list[dict]] = {}
    for stmt in stmts:
        by_type.setdefault(stmt["predicateType"], []).append(stmt)
    missing = [t for t in PREDICATE_TYPES if t not in by_type]
    if missing:
        raise AttestationError("predicates", f"missing {', '.join(missing)}")
    for env, stmt in zip(envelopes, stmts):
        if stmt["predicateType"] == TEST_RESULT_TYPE:
            verify_test_result(env, public_key, digest)
    out.passed.append(f"test result: PASSED ({len(by_type[TEST_RESULT_TYPE])})")
    labels, manifest = image_facts(reg, name, digest)
    for stmt in by_type[PROVENANCE_TYPE]:
        _check_provenance(stmt["predicate"], labels, manifest)
    out.passed.append("provenance: commits equal the image labels and manifest")
    for stmt in by_type[SBOM_TYPE]:
        count = _check_sbom(stmt["predicate"], manifest)
    out.passed.append(f"sbom: covers all {count} distributions in the image manifest")
    out.attestations = [{"predicateType": d["annotations"].get(referrers.PREDICATE_ANNOTATION), "digest": d["digest"]}
                        for d in found]
    return out


def _check_provenance(predicate: dict, labels: dict, manifest: dict) -> None:
    deps = {d.get("name"): d for d in (predicate.get("buildDefinition") or {}).get("resolvedDependencies") or []}
    components = manifest.get("components") or {}
    if not components:
        raise AttestationError("provenance", "the image manifest lists no components")
    for comp, info in sorted(components.items()):
        want = (deps.get(comp) or {}).get("digest") or {}
        label = labels.get(f"{LABEL_PREFIX}.{comp}.commit")
        for what, value in (("image manifest", info.get("commit")), (f"label {LABEL_PREFIX}.{comp}.commit", label)):
            if want.get("gitCommit") != value:
                raise AttestationError("provenance", f"{comp}: provenance commit {want.get('gitCommit')} != {what} {value}")
        if want.get("gitTree") != info.get("tree"):
            raise AttestationError("provenance", f"{comp}: provenance tree {want.get('gitTree')} != image manifest "
                                   f"{info.get('tree')}")


def _check_sbom(predicate: dict, manifest: dict) -> int:
    if not str(predicate.get("specVersion", "")).startswith("1.6") or predicate.get("bomFormat") != "CycloneDX":
        raise AttestationError("sbom", f"expected a CycloneDX 1.6 BOM, got {predicate.get('bomFormat')} "
                               f"{predicate.get('specVersion')}")
    have = sbom.covered(predicate)
    dists = manifest.get("distributions")
    if not dists:
        raise AttestationError("sbom", "the image manifest has no distributions list")
    for dist, version in dists.items():
        got = have.get(sbom.canonical(dist))
        if got is None or got["version"] != version:
            raise AttestationError("sbom", f"{dist} {version} in the image, "
                                   f"{'missing' if got is None else got['version']} in the SBOM")
    for comp, info in (manifest.get("components") or {}).items():
        got = have.get(sbom.canonical(info.get("distribution", "")))
        if not got or got["commit"] != info.get("commit"):
            raise AttestationError("sbom", f"{comp}: SBOM commit {got and got['commit']} != image {info.get('commit')}")
    return len(dists)
