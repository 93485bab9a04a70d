"""Render stage: the unified Dockerfile (templates in dockerfiles/, text helpers in builder/image/dockerfile.py)
and its build context (builder/image/context.py).

`render(pins, sources, settings)` is pure in its inputs: the same pins and the same resolved sources
give a byte-identical Dockerfile and the same context sha256, whatever the cwd or cache dir.
"""
from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from builder.core.constants import BUILDER_VERSION, COMPONENTS, LABEL_PREFIX, SOURCE_DATE_EPOCH
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import RenderedBuild, ResolvedSources
from builder.image import context, dockerfile
from builder.lock import wheels
from builder.pins.model import Pins
from builder.sources import scmversion

UNRESOLVED = "unresolved"
BASE_RX = re.compile(r"[a-z0-9][a-z0-9.:/_-]*@sha256:[0-9a-f]{64}")  # defence in depth behind pins validation


def sha_tag(pins: Pins) -> str:
    """`vllm-<12hex>.megatron-<12hex>.verl-<12hex>` from the three pinned commits."""
    return ".".join(f"{name}-{pins.components[name].commit[:12]}" for name in COMPONENTS)


def image_ref(pins: Pins) -> str:
    return f"{pins.image.repository}:{sha_tag(pins)}"


def created(sources: ResolvedSources | None) -> str:
    """Newest commit time of the three, ISO 8601 UTC (keeps the label reproducible)."""
    if sources is None:
        return UNRESOLVED
    newest = max(sources.components[name].commit_time for name in COMPONENTS)
    return datetime.fromtimestamp(newest, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def venv_root(pins: Pins) -> str:
    """The venv the base interpreter belongs to (python_bin = <venv>/bin/python)."""
    return str(Path(pins.base.python_bin).parent.parent)


def _tree(sources: ResolvedSources | None, name: str) -> str:
    return sources.components[name].tree if sources else UNRESOLVED


def labels(pins: Pins, sources: ResolvedSources | None) -> dict[str, str]:
    verl = pins.components["verl"]
    out = {
        "org.opencontainers.image.source": verl.url,
        "org.opencontainers.image.revision": verl.commit,
        "org.opencontainers.image.created": created(sources),
        "org.opencontainers.image.version": sha_tag(pins),
        "org.opencontainers.image.base.name": pins.base.name,
        "org.opencontainers.image.base.digest": pins.base.digest,
        "org.opencontainers.image.title": pins.name,
    }
    for name in COMPONENTS:
        comp = pins.components[name]
        out[f"{LABEL_PREFIX}.{name}.commit"] = comp.commit
        out[f"{LABEL_PREFIX}.{name}.tree"] = _tree(sources, name)
        out[f"{LABEL_PREFIX}.{name}.pr"] = str(comp.pr)
    return out


def component_entries(pins: Pins, sources: ResolvedSources | None,
                      build_prefixes: list[str] | None = None) -> list[dict[str, Any]]:
    """Per-component template data, in install order (sources None: pins-only review render).
    build_prefixes (the lock's build-only and runtime wheels) are importable while each installs."""
    out: list[dict[str, Any]] = []
    earlier: list[str] = []
    for name in COMPONENTS:
        comp = pins.components[name]
        if sources and sources.components[name].commit != comp.commit:
            raise BadInput(f"components.{name}.commit: resolved {sources.components[name].commit}, "
                           f"pinned {comp.commit}")
        prefix = f"/install/{name}"
        scm = sources.components[name].version if sources else ""
        env_map = dict(comp.install.env)
        if scm:  # the exported tree has no .git: the version computed from the mirror, validated
            env_map.update(scmversion.pretend_env(comp.distribution, scmversion.checked(scm)))
        env = [f"{dockerfile.envkey(k)}={v}" for k, v in dockerfile.items(env_map)]
        out.append({"name": name, "prefix": prefix, "commit": comp.commit, "tree": _tree(sources, name), "pr": comp.pr,
                    "url": comp.url, "target": comp.target, "distribution": comp.distribution,
                    "modules": list(comp.modules), "pip_args": list(comp.install.pip_args), "env": env,
                    "scm_version": scm, "earlier": list(build_prefixes or []) + earlier})
        earlier.append(prefix)
    return out


def render_dockerfile(pins: Pins, sources: ResolvedSources | None) -> str:
    """The Dockerfile text; with sources None the tree and created labels read "unresolved"
    (a review render of pins whose repositories are not reachable; never built)."""
    if not BASE_RX.fullmatch(pins.base.image):
        raise BadInput(f"base.image: expected name@sha256:<64 hex>, got {pins.base.image[:80]!r}")
    runtime, build = wheels.split_lock(pins.lock_path().read_text())
    deps, build_deps = bool(runtime), bool(build)
    comps = component_entries(pins, sources, (["/install/buildtools"] if build_deps else [])
                              + (["/install/deps"] if deps else []))
    prefixes = [("acceptance", "/install/acceptance")]
    prefixes += ([("build", "/install/deps")] if deps else []) + [("build", c["prefix"]) for c in comps]
    data = {
        "builder_version": BUILDER_VERSION, "pins_name": pins.name, "base_image": pins.base.image,
        "python": pins.base.python_bin, "venv": venv_root(pins), "build_env": dict(pins.build.env),
        "source_date_epoch": SOURCE_DATE_EPOCH, "deps": deps, "build_deps": build_deps, "components": comps,
        "prefixes": prefixes, "labels": labels(pins, sources),
    }
    return dockerfile.render_text(data)


def delivery_components(pins: Pins, sources: ResolvedSources, rendered_tag: str) -> dict[str, Any]:
    """What smoke.py and write_manifest.py check and record inside the image."""
    comps = {}
    for c in component_entries(pins, sources):
        comps[c["name"]] = {k: c[k] for k in ("commit", "tree", "pr", "url", "target", "distribution", "modules",
                                              "scm_version")}
    return {"components": comps, "base": {"image": pins.base.image, "name": pins.base.name,
                                          "digest": pins.base.digest},
            "builder_version": BUILDER_VERSION, "python": pins.base.python_bin, "tag": rendered_tag}


def render(pins: Pins, sources: ResolvedSources, settings: Settings) -> RenderedBuild:
    """Render the Dockerfile and assemble the context tar."""
    text = render_dockerfile(pins, sources)
    text_sha = hashlib.sha256(text.encode()).hexdigest()
    tag = image_ref(pins)
    lock = pins.lock_path()
    wheelhouse = None
    if wheels.has_requirements(lock):
        wheelhouse = wheels.ensure_wheels(lock, wheels.Target.from_base(pins.base.python, pins.base.platform),
                                          settings)
    path, context_sha = context.assemble(pins, sources, settings, text, text_sha,
                                         delivery_components(pins, sources, tag), wheelhouse)
    return RenderedBuild(dockerfile=text, dockerfile_sha256=text_sha, context_path=str(path),
                         context_sha256=context_sha, labels=labels(pins, sources), tag=tag)
