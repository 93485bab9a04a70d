"""Smoke check in the runtime stage: every component imports from the venv, its __version__ (when
present) equals the installed distribution version, and its stamped commit/tree equal the pinned ones.
Also prints what the build container saw (network interfaces and mounts) as one `BUILD-ENV {json}`
line of the build log, which the builder checks; nothing per-build is written into the image.

usage: smoke.py COMPONENTS_JSON
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from importlib import metadata
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import native_check  # noqa: E402
from common import built_from_vcs, same_version, site_dirs  # noqa: E402


def check(name: str, spec: dict[str, Any], sites: list[str]) -> dict[str, Any]:
    dist = metadata.distribution(spec["distribution"])
    stamp = json.loads(dist.read_text("BUILDER_PROVENANCE.json") or "null")
    if not stamp:
        raise SystemExit(f"{name}: {spec['distribution']} has no BUILDER_PROVENANCE.json")
    for key in ("commit", "tree", "pr"):
        if stamp.get(key) != spec[key]:
            raise SystemExit(f"{name}: stamped {key} {stamp.get(key)!r} != pinned {spec[key]!r}")
    scm = spec.get("scm_version") or ""
    if scm and not built_from_vcs(dist.version, scm):
        raise SystemExit(f"{name}: installed version {dist.version} != VCS version {scm} computed from the mirror")
    modules: dict[str, dict[str, Any]] = {}
    for module_name in spec["modules"]:
        module = importlib.import_module(module_name)
        where = os.path.realpath(getattr(module, "__file__", "") or "")
        if not any(where.startswith(os.path.realpath(s) + os.sep) for s in sites):
            raise SystemExit(f"{name}: {module_name} imported from {where}, outside {sites}")
        version = getattr(module, "__version__", None)
        # vLLM's __version__ is the VCS version; its CPU build's distribution version appends `.cpu`
        if version is not None and not (same_version(version, dist.version) or built_from_vcs(dist.version, str(version))):
            raise SystemExit(f"{name}: {module_name}.__version__ {version} != installed {dist.version}")
        modules[module_name] = {"file": where, "version": version}
    return {"distribution": spec["distribution"], "version": dist.version, "modules": modules,
            "native": check_native(name, spec.get("native") or {}, dist, sites)}


def extensions(dist: Any) -> list[str]:
    """Absolute paths of the shared objects a distribution's RECORD lists."""
    out: list[str] = []
    for f in dist.files or []:
        base = os.path.basename(str(f))
        if base.endswith(".so") or ".so." in base:
            out.append(os.path.realpath(str(dist.locate_file(f))))
    return out


def check_native(name: str, native: dict[str, Any], dist: Any, sites: list[str],
                 reader: native_check.Reader = native_check.archs_of) -> dict[str, Any]:
    """Each native module loads from a shared object of the component; for a CUDA target every extension
    with device code carries every arch of the pins' list."""
    loaded: dict[str, str] = {}
    for module_name in native.get("modules") or []:
        module = importlib.import_module(module_name)
        where = os.path.realpath(getattr(module, "__file__", "") or "")
        if not where.endswith(".so") or not any(where.startswith(os.path.realpath(s) + os.sep) for s in sites):
            raise SystemExit(f"builder: {name}: native module {module_name} loaded from {where or 'nowhere'},"
                             f" expected a shared object in {sites}")
        loaded[module_name] = where
    arch: dict[str, Any] = {}
    if native.get("device") == "cuda":
        problems, arch = native_check.check_archs(extensions(dist), native.get("cuda_arch") or [], reader)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise SystemExit(f"builder: {name}: {problems[0]}{more}")
    return {"loaded": loaded, "cuda_arch": arch}


def check_base_records(records: dict[str, dict[str, str]] | None, sites: list[str]) -> dict[str, str]:
    """The base's torch (torchvision, torchaudio): its RECORD as read at lock time, every file unchanged."""
    checked: dict[str, str] = {}
    for name, rec in sorted((records or {}).items()):
        info = [os.path.join(s, os.path.dirname(rec["record"])) for s in sites
                if os.path.isfile(os.path.join(s, rec["record"]))]
        if not info:
            raise SystemExit(f"builder: the base's {name} {rec['version']}: {rec['record']} is gone from {sites}")
        problems = native_check.check_record(info[0], rec["sha256"])
        if problems:
            raise SystemExit(f"builder: the base's {name} {rec['version']} changed: {problems[0]}"
                             + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        checked[name] = rec["version"]
    return checked


MARKER = "BUILD-ENV "


def main(components_json: str) -> None:
    spec = json.load(open(components_json))
    sites = site_dirs()
    kept = check_base_records(spec.get("base_records"), sites)  # first: a changed torch may not even import
    result = {name: check(name, comp, sites) for name, comp in sorted(spec["components"].items())}
    env = {
        "net": sorted(os.listdir("/sys/class/net")),
        "mountinfo": open("/proc/self/mountinfo").read().splitlines(),
        "python": sys.executable,
        "site_packages": sites,
    }
    for name, res in result.items():
        print(f"smoke ok: {name} {res['distribution']} {res['version']}")
        for module_name, where in res["native"]["loaded"].items():
            print(f"smoke ok: {name} native {module_name} ({where})")
        for lib, found in res["native"]["cuda_arch"].items():
            print(f"smoke ok: {name} {lib}: sm_{' sm_'.join(map(str, found['elf']))} ({found['read_with']})")
    for name, version in kept.items():
        print(f"smoke ok: the base's {name} {version} unchanged (every RECORD hash)")
    print(MARKER + json.dumps(env, sort_keys=True), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
