"""The run manifest of a report: the six layers of environment provenance (the seed's list), one
function per layer, from the run's records and the image's own /opt/delivery/manifest.json."""
from __future__ import annotations

from typing import Any

from builder.core.constants import CACHE_ENV_VARS, COMPONENTS
from builder.core.imageref import ImageRef
from builder.core.records import AcceptanceResult, BuiltImage, DockerFacts, Evidence, PublishReceipt, ResolvedSources, RunManifest
from builder.lock.record import Lock
from builder.pins.model import Pins

UNKNOWN = "unknown"


def find_manifest(acceptance: AcceptanceResult | None) -> dict[str, Any] | None:
    """/opt/delivery/manifest.json as the acceptance run read it, if it kept a whole copy."""
    if not acceptance:
        return None
    places = [acceptance.environment.get("manifest")] + [g.evidence.manifest for g in acceptance.gates
                                                          if g.name == "provenance"]
    for found in places:
        if isinstance(found, dict) and "components" in found:
            return found
    return None


def provenance(acceptance: AcceptanceResult | None) -> Evidence:
    """Evidence of a provenance gate that ran (in the image, acceptance/provenance.py), else empty."""
    for g in acceptance.gates if acceptance else []:
        if g.name == "provenance" and g.status != "not_run":
            return g.evidence
    return Evidence()


def image_commits(manifest: dict[str, Any] | None, acceptance: AcceptanceResult | None) -> dict[str, str]:
    """Commit of each component as the image records it: manifest, else the stamp provenance read."""
    out = {}
    for name, comp in (provenance(acceptance).components or {}).items():
        commit = (comp.get("stamp") or {}).get("commit")
        if commit:
            out[name] = commit
    for name, comp in ((manifest or {}).get("components") or {}).items():
        if (comp or {}).get("commit"):
            out[name] = comp["commit"]
    return out


def or_unknown(value: Any) -> Any:
    return UNKNOWN if value in (None, "", {}) else value


def env_dict(env: Any) -> dict[str, Any]:
    if isinstance(env, list):  # docker inspect form KEY=VALUE
        return dict(item.split("=", 1) for item in env if "=" in item)
    return dict(env) if isinstance(env, dict) else {}


def source_layer(sources: ResolvedSources, commits: dict[str, str]) -> dict[str, Any]:
    """Layer 1: each component's remote, PR, head, tree, merge-base, submodules, export."""
    return {name: {
        "remote": comp.url, "target": comp.target, "target_head": comp.target_head, "pr": comp.pr,
        "head": comp.commit, "tree": comp.tree, "pr_head": comp.pr_head, "pr_moved": comp.pr_moved,
        "merge_base": comp.merge_base, "ahead": comp.ahead, "behind": comp.behind,
        "dirty_patch": "none (exported from the commit object, no work tree)",
        "submodules": [s.model_dump() for s in comp.submodules],
        "export_sha256": comp.export_sha256, "files": comp.files,
        "commit_in_image": commits.get(name, UNKNOWN),
    } for name, comp in sources.components.items()}


def installed_layer(pins: Pins, names: list[str], manifest: dict[str, Any] | None, prov: Evidence) -> dict[str, Any]:
    """Layer 2: the distribution, version and module files each component installed."""
    mcomps, pcomps = (manifest or {}).get("components") or {}, prov.components or {}
    out = {}
    for name in names:
        pin, m, p = pins.components[name], mcomps.get(name) or {}, pcomps.get(name) or {}
        modules = p.get("modules") or {}
        out[name] = {
            "distribution": pin.distribution, "version": or_unknown(p.get("version") or m.get("version")),
            "modules": {mod: or_unknown((modules.get(mod) or {}).get("file")) for mod in pin.modules},
            "files_in_manifest": len(m["files"]) if isinstance(m.get("files"), dict)
            else or_unknown((p.get("files") or {}).get("manifest")),
        }
    return out


def native_layer(names: list[str], manifest: dict[str, Any] | None, prov: Evidence) -> dict[str, Any]:
    """Layer 3: native libraries in the image and those the provenance check saw loaded."""
    mcomps, loaded = (manifest or {}).get("components") or {}, prov.native_libs_loaded
    out = {}
    for name in names:
        libs = (mcomps.get(name) or {}).get("native_libs")
        mine = {path: lib.get("sha256") for path, lib in (loaded or {}).items() if lib.get("component") == name}
        out[name] = {
            "in_image": UNKNOWN if libs is None else (libs or "none listed in the image manifest"),
            "loaded": UNKNOWN if loaded is None else (mine or "none loaded by the provenance check"),
        }
    return out


def _local(acceptance: AcceptanceResult | None) -> DockerFacts | None:
    """A local container's facts (its environment and tmpfs); a Slurm step's come from the node."""
    return acceptance.where if acceptance and isinstance(acceptance.where, DockerFacts) else None


def jit_layer(acceptance: AcceptanceResult | None, prov: Evidence) -> Any:
    """Layer 4: JIT/compile cache settings, what the caches held at start, and per recipe gate what was
    compiled during its run (acceptance/jitcache.py: kernel, cache key, compiler version, config, origin)."""
    env = env_dict(local.env if (local := _local(acceptance)) else None)
    compiled = {g.name: g.evidence.jit for g in (acceptance.gates if acceptance else []) if g.evidence.jit}
    jit = {"env": {k: env[k] for k in CACHE_ENV_VARS if k in env},
           "tmpfs": (local.tmpfs if local else None),
           "caches_at_start": prov.caches_at_start, "compiled_during_run": compiled}
    return or_unknown({k: v for k, v in jit.items() if v})


def container_layer(pins: Pins, build: BuiltImage | None, acceptance: AcceptanceResult | None,
                    publish: PublishReceipt | None) -> dict[str, Any]:
    """Layer 5: image ID, registry digest, platform, base, and how the image was produced."""
    pulled = acceptance.pulled if acceptance else None
    base = ImageRef(pins.base.image)
    return {
        "image_id": build.image_id if build else (acceptance.image_id if acceptance else UNKNOWN),
        "registry_digest": publish.digest if publish else (pulled.digest if pulled else UNKNOWN),
        "pulled": str(pulled.ref) if pulled else UNKNOWN,
        "platform": publish.platform if publish and publish.platform != UNKNOWN else pins.base.platform,
        "base_image": base.name, "base_digest": (build.base_digest if build and build.base_digest else base.digest)
        or UNKNOWN, "base_index_digest": build.base_index_digest if build else None,
        "produced_by": "Dockerfile build from exported commits (builder)" if build else UNKNOWN,
        "build": build.model_dump(exclude={"log_path"}) if build else UNKNOWN,
        "acceptance": acceptance.where.model_dump(mode="json", exclude={"env", "gates"}) if acceptance else UNKNOWN,
    }


def run_layer(pins: Pins, lock: Lock, sources: ResolvedSources, acceptance: AcceptanceResult | None,
              manifest: dict[str, Any] | None, prov: Evidence) -> dict[str, Any]:
    """Layer 6: the recipe, its environment, the engines, the interpreter, the pins and lock files."""
    env = env_dict(local.env if (local := _local(acceptance)) else None)
    pulled = acceptance.pulled if acceptance else None
    interpreter = prov.interpreter or {}
    recipe = pins.recipe
    return {
        "entry": list(recipe.entry), "overrides": dict(recipe.overrides), "env": dict(recipe.env),
        "aligned_env": dict(recipe.aligned_env), "control_env": dict(recipe.control_env),
        "container_env": or_unknown(env),
        "engine": or_unknown(acceptance.environment.get("engine") if acceptance else None),
        "acceptance_engine": or_unknown(pulled.engine.model_dump() if pulled and pulled.engine else None),
        "interpreter": or_unknown(interpreter.get("executable") or (manifest or {}).get("python")),
        "python_version": or_unknown(interpreter.get("version")),
        "site_packages": or_unknown((prov.manifest or {}).get("site_packages")
                                    or (manifest or {}).get("site_packages")),
        "numeric_env": or_unknown((prov.environment or {}).get("numeric")),
        "gpus": or_unknown(prov.gpu or (acceptance.environment.get("gpu") if acceptance else None)),
        "model_weights_digest": UNKNOWN,  # the demo recipe has no model file; nothing records one
        "pins_file": sources.pins_path, "pins_sha256": sources.pins_sha256,
        "components_shared": list(pins.shared) or "none (url, commit and distribution all distinct)",
        "lock_file": str(lock.path), "lock_sha256": lock.sha256,
    }


def run_manifest(pins: Pins, lock: Lock, sources: ResolvedSources, build: BuiltImage | None, acceptance: AcceptanceResult | None,
                 manifest: dict[str, Any] | None, publish: PublishReceipt | None) -> RunManifest:
    """The six layers (source, installed packages, native libraries, JIT caches, container, run)."""
    prov, names = provenance(acceptance), list(sources.components)
    return RunManifest.model_validate({
        "source": source_layer(sources, image_commits(manifest, acceptance)),
        "installed_packages": installed_layer(pins, names, manifest, prov),
        "native_libraries": native_layer(names, manifest, prov), "jit_caches": jit_layer(acceptance, prov),
        "container": container_layer(pins, build, acceptance, publish),
        "run": run_layer(pins, lock, sources, acceptance, manifest, prov), "native_build": native_build(pins, lock)})


def native_build(pins: Pins, lock: Lock) -> dict[str, Any]:
    """From the lock and the pins: each native input (commit, tree, export sha256, how the build received
    it), each component's build knobs, the torch pins relaxed to the base's torch, the direct URLs mapped."""
    locked = lock.native
    knobs = {}
    for name in COMPONENTS:
        comp = pins.components[name]
        if comp.native is not None or name in locked.cmake or comp.base_torch:
            knobs[name] = {**(comp.native.model_dump() if comp.native else {}), "cmake": name in locked.cmake,
                           "base_torch": comp.base_torch, "env": comp.native.env() if comp.native else {}}
    return {"inputs": [i.record() for i in locked.inputs], "knobs": knobs, "relaxed": locked.relaxed,
            "direct_urls": locked.direct, "base_records": locked.base_records}
