"""`builder verify REPO@sha256:... --key PUB [--key PUB2] [--require-all-keys]`: find the image's attestations
in the registry, select those a trusted key signed for this digest (as cosign does) and check them.

Anyone with push rights can attach an envelope, so envelopes no trusted key signed are listed as
`untrusted: N envelopes (key IDs ...)` and never fail the verification; nor do envelopes a trusted key signed
for another digest (a replayed copy).  Checks on the selected ones, in order (the first that fails is named):
attestations present, a trusted signature, the three predicate types (from each key with --require-all-keys),
a test result of PASSED, provenance commits equal to the image's labels and its /opt/delivery/manifest.json,
an SBOM covering every distribution in that manifest.  Everything is read from the registry, nothing from the
local engine.
"""
from __future__ import annotations

import json
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from builder.core.constants import LABEL_PREFIX, MANIFEST
from builder.core.errors import AttestationError, BadInput, PublishError
from builder.core.imageref import ImageRef, split_digest
from builder.core.options import Settings
from builder.core.safetext import escape, show
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
SHOWN_IDS = 6  # key IDs named on the untrusted line; the rest are counted


@dataclass
class Outcome:
    reference: str
    passed: list[str] = field(default_factory=list)
    attestations: list[dict[str, Any]] = field(default_factory=list)
    untrusted: str = ""  # 'untrusted: N envelopes (key IDs ...)', empty when none
    foreign: str = ""  # 'ignored: N envelopes signed by a trusted key for another subject (...)'


def parse_reference(ref: str) -> tuple[str, str, str]:
    """'host/name@sha256:<hex>' -> (host, name, digest); 'host/name:tag' -> (host, name, "") (resolved later)."""
    try:
        image = ImageRef(ref, need_domain=True)
        if image.digest is None and image.tag is None:
            raise ValueError("neither a digest nor a tag")
    except ValueError as exc:
        raise BadInput(f"{show(ref, 120)}: expected REPOSITORY@sha256:<64 hex> or REPOSITORY:TAG ({exc})") from None
    return image.registry, image.repository, str(image.digest) if image.digest else ""


def resolve(reg: Registry, ref: str) -> str:
    """The digest `ref`'s tag serves now, read once; its digest when it names one (then the tag is not asked)."""
    image = ImageRef(ref, need_domain=True)
    if image.digest is not None:
        return str(image.digest)
    digest = reg.tag_digest(image.repository, str(image.tag))
    if digest is None:
        raise AttestationError("image", f"{ref}: no such tag in the registry")
    return digest


def image_facts(reg: Registry, name: str, digest: str) -> tuple[dict[str, Any], dict[str, Any]]:
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


def verify(ref: str, keys: Sequence[dsse.PublicKey], settings: Settings, require_all_keys: bool = False) -> Outcome:
    """Select the envelopes a trusted key signed for this digest and run every check on them;
    AttestationError names the first that fails.  Other envelopes are listed, never a failure."""
    host, name, digest = parse_reference(ref)
    reg = Registry.from_settings(host, settings)
    reg.ping()
    tagged = "" if digest else ref
    if tagged:  # a tag: resolved once, then only the digest is verified (a tag may move meanwhile)
        digest = resolve(reg, tagged)
        ref = str(ImageRef(tagged, need_domain=True).at(digest))
    out = Outcome(reference=ref)
    if tagged:
        out.passed.append(f"tag: {tagged} serves {digest}")
    found = referrers.discover(reg, name, digest)
    if not found:
        raise AttestationError("attestations", f"no attestations refer to {ref}")
    out.passed.append(f"attestations: {len(found)} found")
    sel = select(reg, name, digest, found, keys)
    out.untrusted, out.foreign = sel.untrusted_line(), sel.foreign_line()
    others = "; ".join(line for line in (out.untrusted, out.foreign) if line) or "untrusted: 0 envelopes"
    if not sel.trusted:
        raise AttestationError("signature", f"none of the {len(found)} envelopes verifies with {_keys(keys)} for "
                               f"this digest; {others}")
    signers = sorted({kid[:16] for _, _, kids in sel.trusted for kid in kids})
    out.passed.append(f"signature: {len(sel.trusted)} envelopes verify with key {', '.join(signers)}")
    out.passed.append(f"subject: every selected statement is for {digest}")
    by_type: dict[str, list[dict[str, Any]]] = {}
    for _, stmt, _ in sel.trusted:
        by_type.setdefault(stmt["predicateType"], []).append(stmt)
    groups = [(dsse.key_id(k), [s for _, s, kids in sel.trusted if dsse.key_id(k) in kids]) for k in keys] \
        if require_all_keys else [("", [s for _, s, _ in sel.trusted])]
    for kid, stmts in groups:
        missing = [t for t in PREDICATE_TYPES if t not in {s["predicateType"] for s in stmts}]
        if missing:
            who = f"key {kid[:16]} signed" if kid else f"the {len(stmts)} envelopes signed by a trusted key are"
            raise AttestationError("predicates", f"missing {', '.join(missing)} ({who} for {digest}); {others}")
    if require_all_keys:
        out.passed.append(f"predicates: each of the {len(keys)} keys signed all three")
    for env, stmt, kids in sel.trusted:
        if stmt["predicateType"] == TEST_RESULT_TYPE:
            verify_test_result(env, next(k for k in keys if dsse.key_id(k) in kids), digest)
    out.passed.append(f"test result: PASSED ({len(by_type[TEST_RESULT_TYPE])})")
    labels, manifest = image_facts(reg, name, digest)
    for stmt in by_type[PROVENANCE_TYPE]:
        _check_provenance(stmt["predicate"], labels, manifest)
    out.passed.append("provenance: commits equal the image labels and manifest")
    for stmt in by_type[SBOM_TYPE]:
        count = _check_sbom(stmt["predicate"], manifest)
    out.passed.append(f"sbom: covers all {count} distributions in the image manifest")
    out.attestations = [{"predicateType": d["annotations"].get(referrers.PREDICATE_ANNOTATION), "digest": d["digest"]}
                        for d in sel.trusted_descriptors]
    return out


@dataclass
class Selection:
    """The referrers of one digest split by trust: (envelope, statement, verifying key IDs) signed by a trusted
    key for this digest; envelopes no trusted key signed (by claimed key ID); trusted ones for another subject."""

    trusted: list[tuple[dict[str, Any], dict[str, Any], set[str]]] = field(default_factory=list)
    trusted_descriptors: list[dict[str, Any]] = field(default_factory=list)
    untrusted: list[str] = field(default_factory=list)  # one claimed key ID (or a reason) per envelope
    foreign: list[str] = field(default_factory=list)  # subjects of trusted envelopes made for another digest

    def untrusted_line(self) -> str:
        if not self.untrusted:
            return ""
        ids = sorted(set(self.untrusted))
        more = f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
        return f"untrusted: {len(self.untrusted)} envelopes (key IDs {', '.join(ids[:SHOWN_IDS])}{more})"

    def foreign_line(self) -> str:
        if not self.foreign:
            return ""
        subjects = sorted(set(self.foreign))
        more = f" and {len(subjects) - SHOWN_IDS} more" if len(subjects) > SHOWN_IDS else ""
        return (f"ignored: {len(self.foreign)} envelopes signed by a trusted key for another subject "
                f"({'; '.join(subjects[:SHOWN_IDS])}{more})")


def select(reg: Registry, name: str, digest: str, found: list[dict[str, Any]], keys: Sequence[dsse.PublicKey]) -> Selection:
    """Sort each referrer into trusted / untrusted / another subject (see Selection); an unreadable or malformed
    referrer is untrusted, never an error: anyone with push rights can attach one."""
    sel = Selection()
    trusted_ids = {dsse.key_id(k) for k in keys}
    for desc in found:
        try:
            envelope = referrers.fetch_envelope(reg, name, desc)[1]
        except (PublishError, ValueError):
            sel.untrusted.append("unreadable")
            continue
        opened = {}
        for key in keys:
            try:
                opened[dsse.key_id(key)] = dsse.open_envelope(envelope, key)
            except dsse.SignatureError:
                continue
        if not opened:
            sel.untrusted.append(_claimed(envelope, trusted_ids))
            continue
        kid = sorted(opened)[0]
        stmt = open_statement(envelope, next(k for k in keys if dsse.key_id(k) == kid), digest, subject=False)
        other = _other_subject(stmt, digest)
        if other:
            sel.foreign.append(other)
            continue
        sel.trusted.append((envelope, stmt, set(opened)))
        sel.trusted_descriptors.append(desc)
    return sel


def _claimed(envelope: dict[str, Any], trusted_ids: set[str]) -> str:
    """The key IDs an untrusted envelope claims (16 hex each); a trusted ID whose signature fails is marked."""
    sigs = envelope.get("signatures") if isinstance(envelope, dict) else None
    ids = []
    for sig in sigs if isinstance(sigs, list) else []:
        kid = str(sig.get("keyid", "")) if isinstance(sig, dict) else ""
        if kid:
            ids.append(f"{show_id(kid)} (bad signature)" if kid in trusted_ids else show_id(kid))
    return "+".join(ids) or "none"


def show_id(kid: str) -> str:
    """A claimed key ID as printed: its first 16 characters, escaped (it is untrusted text)."""
    return escape(kid[:16])


def _other_subject(stmt: dict[str, Any], digest: str) -> str:
    algo, hexpart = split_digest(digest)
    subjects = [s.get("digest", {}).get(algo) if isinstance(s, dict) else None for s in stmt.get("subject") or []]
    if subjects and all(s == hexpart for s in subjects):
        return ""
    return ", ".join(f"{algo}:{escape(str(s))[:12]}" for s in subjects) or "no subject"


def _keys(keys: Sequence[dsse.PublicKey]) -> str:
    ids = [dsse.key_id(k)[:16] for k in keys]
    return f"key {ids[0]}" if len(ids) == 1 else f"any of keys {', '.join(ids)}"


def _check_provenance(predicate: dict[str, Any], labels: dict[str, Any], manifest: dict[str, Any]) -> None:
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


def _check_sbom(predicate: dict[str, Any], manifest: dict[str, Any]) -> int:
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
