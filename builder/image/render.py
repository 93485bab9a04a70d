"""Render stage: the unified Dockerfile (templates in dockerfiles/, text helpers in builder/image/dockerfile.py)
and its build context (builder/image/context.py).

`render(pins, lock, sources, settings)` is deterministic in its inputs: the same pins, lock and resolved
sources give a byte-identical Dockerfile and the same context sha256, whatever the cwd or cache dir. It is
not pure: it fills the wheelhouse (`pip download` of the locked wheels when the cache lacks them) and
exports the sources and native inputs into the cache. The lock is the `Lock` the pipeline read once.
"""
from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from builder.core.constants import BUILDER_VERSION, CACHE_KEY_LABEL, COMPONENTS, LABEL_PREFIX, SOURCE_DATE_EPOCH
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import RenderedBuild, ResolvedSources
from builder.engine.platforms import BaseManifest
from builder.image import context, dockerfile, identity
from builder.lock import native, wheels
from builder.lock.record import Lock
from builder.pins.model import Pins
from builder.sources import scmversion

UNRESOLVED = "unresolved"


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


def cache_scope(pins: Pins) -> str:
    """`image.cache_scope`, default `<name>@<repository>`: each pins file its own layer cache."""
    return pins.image.cache_scope or f"{pins.name}@{pins.image.repository}"


def cache_key(pins: Pins) -> str:
    """Which run this is (its cache scope, not the commits): the first instruction of each stage on the base
    carries it (`<key>.prepare`, `<key>.runtime`: the classic builder takes the newest child with the same
    instruction as cache parent, so two stages must not share one), so the engine never takes another scope's
    identical layer as the parent of this run's cached layers, while a new commit of the same pins still reuses
    them. Pins files that name one scope (a fleet of variants of one stack) share their layers."""
    return hashlib.sha256(cache_scope(pins).encode()).hexdigest()[:16]


def layer_epochs(sources: ResolvedSources, deps: bool) -> list[int]:
    """Source date of each layer the runtime stage adds, in order: the builder's scripts and the acceptance
    suite, the locked wheels (SOURCE_DATE_EPOCH, as the lock itself), each component at its commit time,
    then the delivery files and the finish step at the newest commit time (they name all three)."""
    commits = [sources.components[name].commit_time for name in COMPONENTS]
    fixed = [SOURCE_DATE_EPOCH] * (3 if deps else 2)
    return fixed + commits + [max(commits)] * 2


def venv_root(pins: Pins) -> str:
    """The venv the base interpreter belongs to (python_bin = <venv>/bin/python)."""
    return str(Path(pins.base.python_bin).parent.parent)


def _tree(sources: ResolvedSources | None, name: str) -> str:
    return sources.components[name].tree if sources else UNRESOLVED


def labels(pins: Pins, sources: ResolvedSources | None, base_digest: str | None = None) -> dict[str, str]:
    """The image's labels, from build inputs only (identity.py): no pins name, no repository; the source
    annotation only for a network remote; the base digest is the platform manifest's (base_digest, when the pins
    name an index)."""
    verl = pins.components["verl"]
    out = {
        "org.opencontainers.image.revision": verl.commit,
        "org.opencontainers.image.created": created(sources),
        "org.opencontainers.image.version": sha_tag(pins),
        "org.opencontainers.image.base.name": pins.base.name,
        "org.opencontainers.image.base.digest": base_digest or pins.base.digest,
    }
    source = identity.source_url(verl.url)
    if source is not None:
        out["org.opencontainers.image.source"] = source
    for name in COMPONENTS:
        comp = pins.components[name]
        out[f"{LABEL_PREFIX}.{name}.commit"] = comp.commit
        out[f"{LABEL_PREFIX}.{name}.tree"] = _tree(sources, name)
        out[f"{LABEL_PREFIX}.{name}.pr"] = str(comp.pr)
    return out


NATIVE_DIR = "/builder/native"
PROVIDER = "/builder/scripts/native_provider.cmake"


def native_env(name: str, locked: native.Locked) -> dict[str, str]:
    """A CMake-built component's build env: the toolchain file (disconnected FetchContent, the lock's
    sources) and the project's own *_SRC_DIR variables pointing at the supplied sources."""
    if name not in locked.cmake:
        return {}
    out = {"CMAKE_TOOLCHAIN_FILE": f"{NATIVE_DIR}/{name}/toolchain.cmake"}
    for item in locked.of(name):
        if not item.receive.startswith("FETCHCONTENT_SOURCE_DIR_"):
            out[item.receive] = f"{NATIVE_DIR}/{name}/{item.name}"
    return out


def toolchain(name: str, locked: native.Locked) -> str:
    """The CMake toolchain file of a component's build: FetchContent fully disconnected, every locked
    input at its supplied source, any other FetchContent_MakeAvailable refused by the provider."""
    inputs = locked.of(name)
    lines = [f"# Generated by builder from the lock: the native inputs of {name}; the build never fetches.",
             'set(FETCHCONTENT_FULLY_DISCONNECTED ON CACHE BOOL "" FORCE)',
             'set(CMAKE_POLICY_DEFAULT_CMP0170 NEW)']
    lines += [f'set(FETCHCONTENT_SOURCE_DIR_{i.name.upper()} "{NATIVE_DIR}/{name}/{i.name}" CACHE PATH "" FORCE)'
              for i in inputs]
    lines += [f'set(BUILDER_NATIVE_INPUTS "{";".join(i.name.lower() for i in inputs)}")',
              f'set(CMAKE_PROJECT_TOP_LEVEL_INCLUDES "{PROVIDER}")']
    return "\n".join(lines) + "\n"


def component_entries(pins: Pins, sources: ResolvedSources | None,
                      build_prefixes: list[str] | None = None, locked: native.Locked | None = None) -> list[dict[str, Any]]:
    """Per-component template data, in install order (sources None: pins-only review render).
    build_prefixes (the lock's build-only and runtime wheels) are importable while each installs."""
    out: list[dict[str, Any]] = []
    earlier: list[str] = []
    locked = locked or native.Locked()
    for name in COMPONENTS:
        comp = pins.components[name]
        if sources and sources.components[name].commit != comp.commit:
            raise BadInput(f"components.{name}.commit: resolved {sources.components[name].commit}, "
                           f"pinned {comp.commit}")
        prefix = f"/install/{name}"
        scm = sources.components[name].version if sources else ""
        tool_env = native_env(name, locked)
        both = sorted(set(tool_env) & set(comp.build_env()))
        if both:
            raise BadInput(f"components.{name}.install.env: {both[0]} is set by the tool for this CMake build"
                           " (its native inputs from the lock); expected it unset")
        env_map = {**comp.build_env(), **tool_env}
        if scm:  # the exported tree has no .git: the version computed from the mirror, validated
            env_map.update(scmversion.pretend_env(comp.distribution, scmversion.checked(scm)))
        env = [f"{dockerfile.envkey(k)}={v}" for k, v in dockerfile.items(env_map)]
        out.append({"name": name, "prefix": prefix, "commit": comp.commit, "tree": _tree(sources, name), "pr": comp.pr,
                    "url": comp.url, "target": comp.target, "distribution": comp.distribution,
                    "modules": list(comp.modules), "pip_args": list(comp.install.pip_args), "env": env,
                    "scm_version": scm, "earlier": list(build_prefixes or []) + earlier,
                    "native": name in locked.cmake})
        earlier.append(prefix)
    return out


def render_dockerfile(pins: Pins, lock: Lock, sources: ResolvedSources | None, base: BaseManifest | None = None) -> str:
    """The Dockerfile text; with sources None the tree and created labels read "unresolved"
    (a review render of pins whose repositories are not reachable; never built). `base`: the base resolved to its
    platform manifest (engine/platforms.py), named in FROM; None: the pinned digest as written."""
    if not dockerfile.pinned_base(str(pins.base.image)):  # defence in depth behind pins validation
        raise BadInput(f"base.image: expected name@sha256:<64 hex>, got {pins.base.image[:80]!r}")
    deps, build_deps = bool(lock.runtime), bool(lock.build)
    comps = component_entries(pins, sources, (["/install/buildtools"] if build_deps else [])
                              + (["/install/deps"] if deps else []), lock.native)
    prefixes = [("acceptance", "/install/acceptance")]
    prefixes += ([("build", "/install/deps")] if deps else []) + [("build", c["prefix"]) for c in comps]
    data = {
        "builder_version": BUILDER_VERSION, "base_image": base.reference if base else pins.base.image,
        "python": pins.base.python_bin, "venv": venv_root(pins), "build_env": dict(pins.build.env),
        "source_date_epoch": SOURCE_DATE_EPOCH, "deps": deps, "build_deps": build_deps, "components": comps,
        "prefixes": prefixes, "labels": labels(pins, sources, base.digest if base else None),
        "cache_key_label": CACHE_KEY_LABEL, "cache_key": cache_key(pins),
    }
    return dockerfile.render_text(data)


def native_record(pins: Pins, name: str, locked: native.Locked) -> dict[str, Any]:
    """A component's native build as smoke.py checks it and the manifest records it: knobs, native
    modules, the locked inputs (commit, tree, export sha256)."""
    knobs = pins.components[name].native
    return {"device": knobs.device if knobs else None, "device_var": knobs.device_var if knobs else None,
            "cuda_arch": list(knobs.cuda_arch) if knobs else [],
            "max_jobs": knobs.max_jobs if knobs and knobs.max_jobs else pins.build.env.get("MAX_JOBS"),
            "nvcc_threads": knobs.nvcc_threads if knobs and knobs.nvcc_threads else pins.build.env.get("NVCC_THREADS"),
            "modules": list(knobs.modules) if knobs else [], "cmake": name in locked.cmake,
            "base_torch": pins.components[name].base_torch,
            "inputs": [i.record() for i in locked.of(name)]}


def delivery_components(pins: Pins, lock: Lock, sources: ResolvedSources, rendered_tag: str,
                        base: BaseManifest | None = None) -> dict[str, Any]:
    """What smoke.py and write_manifest.py check and record inside the image (the base by its platform manifest)."""
    locked = lock.native
    comps = {}
    for c in component_entries(pins, sources, locked=locked):
        comps[c["name"]] = {k: c[k] for k in ("commit", "tree", "pr", "url", "distribution", "modules", "scm_version")}
        comps[c["name"]]["native"] = native_record(pins, c["name"], locked)
    image, digest = (base.reference, base.digest) if base else (pins.base.image, pins.base.digest)
    return {"components": comps, "base": {"image": image, "name": pins.base.name, "digest": digest},
            "base_records": locked.base_records, "relaxed": locked.relaxed, "direct_urls": locked.direct,
            "builder_version": BUILDER_VERSION, "python": pins.base.python_bin, "tag": rendered_tag}  # the SHA tag


def dockerfile_sha256(pins: Pins, text: str) -> str:
    """The Dockerfile's sha256 as the image and the report record it: with the run's cache key masked (the
    key's label never reaches the image: engine/normalize.py drops it), so that it names only build inputs."""
    return hashlib.sha256(text.replace(cache_key(pins), "<cache-key>").encode()).hexdigest()


def render(pins: Pins, lock: Lock, sources: ResolvedSources, settings: Settings,
           base: BaseManifest | None = None) -> RenderedBuild:
    """Render the Dockerfile and assemble the context tar (`base`: the pipeline's resolved platform manifest)."""
    text = render_dockerfile(pins, lock, sources, base)
    text_sha = dockerfile_sha256(pins, text)
    tag = image_ref(pins)
    wheelhouse = None
    if lock.entries:
        wheelhouse = wheels.ensure_wheels(lock.path, lock.text, lock.wheel_key,
                                          wheels.Target.from_base(pins.base.python, pins.base.platform), settings)
    locked = lock.native
    path, context_sha = context.assemble(pins, lock, sources, settings, text, text_sha,
                                         delivery_components(pins, lock, sources, sha_tag(pins), base), wheelhouse,
                                         {name: toolchain(name, locked) for name in locked.cmake})
    return RenderedBuild(dockerfile=text, dockerfile_sha256=text_sha, context_path=str(path),
                         context_sha256=context_sha, labels=labels(pins, sources, base.digest if base else None),
                         tag=tag, base_digest=base.digest if base else pins.base.digest,
                         base_index_digest=base.index_digest if base else None,
                         layer_epochs=layer_epochs(sources, bool(lock.runtime)), cache_key=cache_key(pins))
