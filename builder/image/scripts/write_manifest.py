"""Write /opt/delivery/manifest.json (format in docs/image.md) from what is installed in this image.

usage: write_manifest.py COMPONENTS_JSON PINS_JSON DOCKERFILE_SHA256 OUT
Every file a component's RECORD lists is hashed on disk; a hash that disagrees with RECORD fails.
"""
from __future__ import annotations

import base64
import csv
import io
import json
import os
import sys
from importlib import metadata
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import record_hash, sha256_file, site_dirs  # noqa: E402

from acceptance.interpreters import PYTHON_NAME, carries_runtime  # the suite is installed before this step
from acceptance.procfs import startup_hooks


def is_native(path: str) -> bool:
    base = os.path.basename(path)
    return base.endswith(".so") or ".so." in base


def installed_files(dist: metadata.Distribution, site: str) -> tuple[dict[str, str], dict[str, str]]:
    files: dict[str, str] = {}
    native: dict[str, str] = {}
    info = os.path.dirname(str(dist._path)) if hasattr(dist, "_path") else site
    record = dist.read_text("RECORD") or ""
    for row in csv.reader(io.StringIO(record)):
        if not row or not row[0]:
            continue
        path = os.path.realpath(os.path.join(info, row[0]))
        if not os.path.isfile(path):
            raise SystemExit(f"{dist.metadata['Name']}: RECORD lists {row[0]}, missing at {path}")
        digest = sha256_file(path)
        if len(row) > 1 and row[1] and row[1] != record_hash(digest):
            raise SystemExit(f"{dist.metadata['Name']}: {path} does not match its RECORD hash")
        files[path] = digest
        if is_native(path):
            native[path] = digest
    return dict(sorted(files.items())), dict(sorted(native.items()))


BIN_DIRS = ("/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin")


def interpreters() -> list[dict[str, Any]]:
    """Every Python interpreter of the image: each program in the bin folders (the venv's and the system's) that
    is named python* or is an ELF carrying the Python runtime, by its real file, with its sha256 and the names
    that lead to it. The census tells an interpreter by these (acceptance/interpreters.py)."""
    found: dict[str, set[str]] = {}
    for folder in sorted({os.path.join(sys.prefix, "bin"), os.path.join(sys.base_prefix, "bin"), *BIN_DIRS}):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            if os.path.isfile(real) and (real in found or PYTHON_NAME.fullmatch(name) or carries_runtime(real)):
                if PYTHON_NAME.fullmatch(name) and not carries_runtime(real) and not _links_libpython(real):
                    continue  # python3-config and the like: scripts, no interpreter
                found.setdefault(real, set()).add(path)
    return [{"path": real, "sha256": sha256_file(real), "names": sorted(names)} for real, names in sorted(found.items())]


def _links_libpython(path: str) -> bool:
    """An ELF whose dynamic section names a libpython (an interpreter built --enable-shared)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(1 << 16) if fh.read(4) == b"\x7fELF" else b""
            fh.seek(0)
            return b"libpython" in (fh.read() if data else b"")
    except OSError:
        return False


def native_owners() -> dict[str, dict[str, str]]:
    """Every native library a distribution's RECORD lists, by real path: {path: {distribution, version, sha256}},
    the sha256 RECORD's own (checked against the file for the components above, pip checked the rest at install)."""
    owners: dict[str, dict[str, str]] = {}
    for dist in metadata.distributions():
        info = os.path.dirname(str(dist._path)) if hasattr(dist, "_path") else ""
        for row in csv.reader(io.StringIO(dist.read_text("RECORD") or "")):
            if len(row) > 1 and row[0] and is_native(row[0]) and row[1].startswith("sha256="):
                raw = base64.urlsafe_b64decode(row[1][7:] + "=" * (-len(row[1][7:]) % 4))
                path = os.path.realpath(os.path.join(info, row[0]))
                owners.setdefault(path, {"distribution": dist.metadata["Name"], "version": dist.version,
                                         "sha256": raw.hex()})
    return dict(sorted(owners.items()))


def distributions() -> dict[str, str]:
    """Every Python distribution importable in this image: {name: version}, first on sys.path wins."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in {n.lower() for n in found}:
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def main(components_json: str, pins_json: str, dockerfile_sha_file: str, out: str) -> None:
    spec = json.load(open(components_json))
    site = site_dirs()[0]
    components: dict[str, dict[str, Any]] = {}
    for name, comp in sorted(spec["components"].items()):
        dist = metadata.distribution(comp["distribution"])
        files, native = installed_files(dist, site)
        components[name] = {**{k: comp[k] for k in ("commit", "tree", "pr", "url", "distribution", "modules")},
                            "version": dist.version, "version_from_vcs": bool(comp.get("scm_version")),
                            "files": files, "native_libs": native}
        if comp.get("native"):  # build knobs and the native inputs it was built from (commit, tree, export sha256)
            components[name]["native_build"] = comp["native"]
    extra: dict[str, dict[str, str] | None] = {}
    try:
        suite = metadata.distribution("truepolicy-acceptance")
        extra["acceptance"] = {"distribution": "truepolicy-acceptance", "version": suite.version}
    except metadata.PackageNotFoundError:
        extra["acceptance"] = None
    manifest = {
        "schema": 1,
        "pins": json.load(open(pins_json)),
        "base": {"image": spec["base"]["image"], "digest": spec["base"]["digest"]},
        "builder_version": spec["builder_version"],
        "dockerfile_sha256": open(dockerfile_sha_file).read().strip(),
        "components": components,
        "distributions": distributions(),
        "python": spec["python"],
        "site_packages": site,
        "startup_hooks": startup_hooks(sys.path),
        "interpreters": interpreters(),
        "native_owners": native_owners(),
        "tag": spec["tag"],
        "base_records": spec.get("base_records") or {},
        "relaxed": spec.get("relaxed") or [],
        "direct_urls": spec.get("direct_urls") or [],
        **extra,
    }
    with open(out, "w") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
        fh.write("\n")
    for name, comp in components.items():
        print(f"manifest: {name} {comp['distribution']} {comp['version']}: {len(comp['files'])} files,"
              f" {len(comp['native_libs'])} native")


if __name__ == "__main__":
    main(*sys.argv[1:])
