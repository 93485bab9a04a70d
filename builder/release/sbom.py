"""CycloneDX 1.6 SBOM of the Python distributions in an image, built with cyclonedx-python-lib.

The source is the image's /opt/delivery/manifest.json: `distributions` (every distribution importable
in the image) and `components` (the three PRs; each carries its VCS commit as a pedigree commit and a
VCS external reference).
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cyclonedx.model.component import Component

PREDICATE_TYPE = "https://cyclonedx.org/bom"
COMMIT_PROPERTY = "truepolicy:vcs-commit"


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _component(name: str, version: str, vcs: dict[str, Any] | None) -> Component:
    from cyclonedx.model import ExternalReference, ExternalReferenceType, Property, XsUri  # lazy: start-up
    from cyclonedx.model.component import Commit, Component, ComponentType, Pedigree  # lazy: start-up
    from packageurl import PackageURL  # lazy: start-up

    qualifiers = {}
    refs, pedigree, props = [], None, []
    if vcs:
        url = vcs.get("url", "")
        qualifiers = {"vcs_url": f"git+{url}@{vcs['commit']}"} if url else {}
        if re.match(r"^(https?|ssh|git|file)://", url):
            refs = [ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(url), comment=f"commit {vcs['commit']}")]
        pedigree = Pedigree(commits=[Commit(uid=vcs["commit"])])
        props = [Property(name=COMMIT_PROPERTY, value=vcs["commit"]),
                 Property(name="truepolicy:component", value=vcs["component"])]
    return Component(name=name, version=version, type=ComponentType.LIBRARY, bom_ref=f"pypi/{canonical(name)}",
                     purl=PackageURL(type="pypi", name=canonical(name), version=version, qualifiers=qualifiers),
                     external_references=refs, pedigree=pedigree, properties=props)


def build(image_manifest: dict[str, Any], repository: str, digest: str) -> dict[str, Any]:
    """The SBOM (as a JSON dict) of the image `repository@digest` whose manifest is `image_manifest`.
    cyclonedx is imported here, not at the top: it is about 80 ms of every CLI call, and only attest needs it."""
    from cyclonedx.model.bom import Bom  # lazy: start-up
    from cyclonedx.model.component import Component, ComponentType  # lazy: start-up
    from cyclonedx.output.json import JsonV1Dot6  # lazy: start-up

    vcs = {canonical(c["distribution"]): {**c, "component": name}
           for name, c in (image_manifest.get("components") or {}).items()}
    dists = dict(image_manifest.get("distributions") or {})
    for comp in vcs.values():  # a manifest without the full list still names the three components
        dists.setdefault(comp["distribution"], comp.get("version", ""))
    bom = Bom()
    root = Component(name=repository, version=digest, type=ComponentType.CONTAINER, bom_ref=f"{repository}@{digest}")
    bom.metadata.component = root
    parts = [_component(name, version, vcs.get(canonical(name)))
             for name, version in sorted(dists.items(), key=lambda kv: canonical(kv[0]))]
    for part in parts:
        bom.components.add(part)
    bom.register_dependency(root, parts)
    doc: dict[str, Any] = json.loads(JsonV1Dot6(bom).output_as_string())
    return doc


def covered(sbom: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{canonical name: {version, commit}} of the SBOM's components."""
    out = {}
    for comp in sbom.get("components") or []:
        props = {p.get("name"): p.get("value") for p in comp.get("properties") or []}
        out[canonical(comp.get("name", ""))] = {"version": comp.get("version"), "commit": props.get(COMMIT_PROPERTY)}
    return out
