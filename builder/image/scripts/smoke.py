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
from common import same_version, site_dirs  # noqa: E402


def check(name: str, spec: dict[str, Any], sites: list[str]) -> dict[str, Any]:
    dist = metadata.distribution(spec["distribution"])
    stamp = json.loads(dist.read_text("BUILDER_PROVENANCE.json") or "null")
    if not stamp:
        raise SystemExit(f"{name}: {spec['distribution']} has no BUILDER_PROVENANCE.json")
    for key in ("commit", "tree", "pr"):
        if stamp.get(key) != spec[key]:
            raise SystemExit(f"{name}: stamped {key} {stamp.get(key)!r} != pinned {spec[key]!r}")
    scm = spec.get("scm_version") or ""
    if scm and dist.version != scm:
        raise SystemExit(f"{name}: installed version {dist.version} != VCS version {scm} computed from the mirror")
    modules: dict[str, dict[str, Any]] = {}
    for module_name in spec["modules"]:
        module = importlib.import_module(module_name)
        where = os.path.realpath(getattr(module, "__file__", "") or "")
        if not any(where.startswith(os.path.realpath(s) + os.sep) for s in sites):
            raise SystemExit(f"{name}: {module_name} imported from {where}, outside {sites}")
        version = getattr(module, "__version__", None)
        if version is not None and not same_version(version, dist.version):
            raise SystemExit(f"{name}: {module_name}.__version__ {version} != installed {dist.version}")
        modules[module_name] = {"file": where, "version": version}
    return {"distribution": spec["distribution"], "version": dist.version, "modules": modules}


MARKER = "BUILD-ENV "


def main(components_json: str) -> None:
    spec = json.load(open(components_json))
    sites = site_dirs()
    result = {name: check(name, comp, sites) for name, comp in sorted(spec["components"].items())}
    env = {
        "net": sorted(os.listdir("/sys/class/net")),
        "mountinfo": open("/proc/self/mountinfo").read().splitlines(),
        "python": sys.executable,
        "site_packages": sites,
    }
    for name, res in result.items():
        print(f"smoke ok: {name} {res['distribution']} {res['version']}")
    print(MARKER + json.dumps(env, sort_keys=True), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
