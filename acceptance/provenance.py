"""Provenance gate: the interpreter, the imported modules, their files and the loaded native libraries are
exactly the ones the image's manifest records, read from the image's own site-packages (not a mount)."""
import importlib
import importlib.metadata as md
import json
import os
import shutil
import sys
from typing import Any

from acceptance import gpu, procfs
from acceptance.defaults import CACHE_ENV_VARS as CACHE_ENV
from acceptance.hook import numeric_env

HOME_CACHES = (".cache/torch", ".triton", ".cache/vllm", ".cache/torch_extensions", ".cache/flashinfer",
               ".nv/ComputeCache")


def cache_dirs(settings: dict[str, Any]) -> list[str]:
    """The compile/JIT cache locations this process would use, plus the usual defaults under /root."""
    dirs = [settings.get("cache_dir", "/cache")]
    dirs += [os.environ[k] for k in CACHE_ENV if os.environ.get(k)]
    for home in {os.path.expanduser("~"), "/root"}:
        dirs += [os.path.join(home, sub) for sub in HOME_CACHES]
    dirs.append(f"/tmp/torchinductor_{os.environ.get('USER') or 'root'}")
    return list(dict.fromkeys(dirs))


def cache_files(path: str, limit: int = 5) -> list[str]:
    found = []
    for root, _, files in os.walk(path):
        found += [os.path.join(root, f) for f in files]
        if len(found) >= limit:
            break
    return found[:limit]


def _dist_info_dir(dist: md.Distribution) -> str | None:
    for entry in dist.files or []:
        if entry.parts and entry.parts[0].endswith(".dist-info"):
            return str(dist.locate_file(entry.parts[0]))
    path = getattr(dist, "_path", None)
    return str(path) if path else None


class Checker:
    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.failures: list[str] = []
        self.evidence: dict[str, Any] = {}

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def caches(self) -> None:
        """Run before anything is imported: every compile cache starts empty (no inherited JIT artifacts), but for a
        node-local cache the runner isolated by image, commits, GPU architecture and rank (settings.jit_cache): its
        entries were compiled by this very image on this node, and are listed with their sha256."""
        seen = {}
        node_local = (self.settings.get("jit_cache") or {}).get("dir")
        for path in cache_dirs(self.settings):
            files = cache_files(path) if os.path.isdir(path) else []
            seen[path] = files
            if files and not (node_local and (path + "/").startswith(node_local.rstrip("/") + "/")):
                self.fail(f"compile cache {path} not empty at start: {files[:2]}")
        self.evidence["caches_at_start"] = seen
        if node_local:
            from acceptance import jitcache

            listed = jitcache.listing([node_local])
            self.evidence["jit_cache"] = {**(self.settings.get("jit_cache") or {}), "entries": len(listed),
                                          "files": [{"file": f, "sha256": h} for f, h in sorted(listed.items())][:64]}

    def interpreter(self, manifest: dict[str, Any]) -> None:
        expected = manifest.get("python")
        entry = (self.settings.get("entry") or [""])[0]
        resolved = shutil.which(entry) if entry else None
        self.evidence["interpreter"] = {"executable": sys.executable, "version": sys.version, "prefix": sys.prefix,
                                        "path": list(sys.path), "manifest_python": expected,
                                        "recipe_entry": entry, "recipe_entry_resolved": resolved}
        if os.path.abspath(sys.executable) != expected:
            self.fail(f"interpreter {sys.executable} is not the manifest's python {expected}")
        base = os.path.basename(entry)
        if base.startswith("python"):
            if not resolved or os.path.dirname(os.path.abspath(resolved)) != os.path.dirname(expected or ""):
                self.fail(f"recipe entry {entry!r} resolves to {resolved}, not the manifest's python {expected}")

    def mounts(self, site: str) -> list[dict[str, str]]:
        table = procfs.mounts()
        self.evidence["mounts"] = [f"{m['mount_point']} ({m['fstype']} {m['source']} {m['options']})" for m in table]
        for m in table:
            point = m["mount_point"]
            if point != "/" and (procfs.covers(point, site) or procfs.covers(site, point)):
                self.fail(f"mount at {point} ({m['fstype']} {m['source']}) covers site-packages {site}")
        return table

    def component(self, name: str, spec: dict[str, Any], site: str, table: list[dict[str, str]]) -> dict[str, Any]:
        out: dict[str, Any] = {"distribution": spec.get("distribution"), "modules": {}}
        dist_name: str = spec.get("distribution") or ""  # "" raises ValueError as None does
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError:
            self.fail(f"{name}: distribution {dist_name} not installed")
            return out
        out["version"] = dist.version
        if dist.version != spec.get("version"):
            self.fail(f"{name}: {dist_name} version {dist.version}, manifest says {spec.get('version')}")
        info = _dist_info_dir(dist)
        out["dist_info"] = info
        if not info or not os.path.realpath(info).startswith(os.path.realpath(site) + "/"):
            self.fail(f"{name}: {dist_name} metadata at {info}, not in site-packages {site}")
        self._stamp(name, spec, info, out)
        self._files(name, spec, dist, out)  # hashed before the import can write anything
        native = (spec.get("native_build") or {}).get("modules") or []  # e.g. vllm._C: `import vllm` may not load it
        for module in dict.fromkeys([*(spec.get("modules") or []), *native]):
            out["modules"][module] = self._module(name, module, site, table)
        self._strays(name, spec, out)
        return out

    def _stamp(self, name: str, spec: dict[str, Any], info: str | None, out: dict[str, Any]) -> None:
        path = os.path.join(info or "", "BUILDER_PROVENANCE.json")
        try:
            with open(path) as fh:
                stamp = json.load(fh)
        except (OSError, ValueError) as err:
            self.fail(f"{name}: {path} unreadable ({err.__class__.__name__})")
            return
        out["stamp"] = stamp
        if stamp.get("commit") != spec.get("commit"):
            self.fail(f"{name}: stamped commit {stamp.get('commit')}, manifest says {spec.get('commit')}")

    def _module(self, name: str, module: str, site: str, table: list[dict[str, str]]) -> dict[str, Any]:
        try:
            mod = importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any import error is the finding
            self.fail(f"{name}: import {module} failed: {err.__class__.__name__}: {err}")
            return {"error": str(err)}
        path = os.path.abspath(getattr(mod, "__file__", None) or "")
        real = os.path.realpath(path)
        if not real.startswith(os.path.realpath(site) + "/"):
            self.fail(f"{name}: {module} imported from {path}, not from site-packages {site}")
        for m in table:
            point = m["mount_point"]
            if point != "/" and (procfs.covers(point, path) or procfs.covers(point, real)):
                self.fail(f"{name}: {module} file {path} lies under mount {m['mount_point']} ({m['source']})")
        return {"file": path, "realpath": real, "version": getattr(mod, "__version__", None)}

    def _files(self, name: str, spec: dict[str, Any], dist: md.Distribution, out: dict[str, Any]) -> None:
        files = spec.get("files") or {}
        bad = [p for p, digest in files.items() if procfs.sha256(p) != digest]
        for path in bad[:5]:
            self.fail(f"{name}: {path} sha256 {procfs.sha256(path) or 'missing'} differs from the manifest")
        recorded = {os.path.realpath(str(dist.locate_file(f))) for f in dist.files or []}
        extra = sorted(p for p in recorded - set(files) if not _ignorable(p))
        for path in extra[:5]:
            self.fail(f"{name}: {path} is in RECORD but not in the manifest")
        out["files"] = {"manifest": len(files), "mismatched": bad[:20], "record_only": extra[:20]}

    def _strays(self, name: str, spec: dict[str, Any], out: dict[str, Any]) -> None:
        """Files inside a component's package directories that the manifest does not list."""
        files = spec.get("files") or {}
        strays = []
        for pkg in {os.path.dirname(v["realpath"]) for v in out["modules"].values()
                    if v.get("realpath", "").endswith("__init__.py")}:
            for root, dirs, names in os.walk(pkg):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                strays += [os.path.join(root, n) for n in names if os.path.join(root, n) not in files]
        for path in strays[:5]:
            self.fail(f"{name}: {path} is installed but not in the manifest")
        out["files"]["unlisted"] = strays[:20]

    def startup(self, manifest: dict[str, Any]) -> None:
        """.pth files and sitecustomize/usercustomize on sys.path now must be exactly those of the build:
        a new one can patch a component at start-up without touching its files."""
        expected = manifest.get("startup_hooks")
        now = procfs.startup_hooks(sys.path)
        self.evidence["startup_hooks"] = now
        if expected is None:
            self.fail("manifest records no startup_hooks (.pth / sitecustomize); cannot rule out start-up patches")
            return
        for path, digest in now.items():
            if path not in expected:
                self.fail(f"start-up hook {path} is not in the manifest")
            elif expected[path] != digest:
                self.fail(f"start-up hook {path} changed since the build")

    def native(self, manifest: dict[str, Any]) -> None:
        """Hash every mapped .so; component ones must be in the manifest's native_libs with that hash."""
        comps = manifest.get("components") or {}
        owned = {}
        for name, spec in comps.items():
            for path in list(spec.get("files") or {}) + list(spec.get("native_libs") or {}):
                owned[path] = name
        roots = {}
        for name, spec in comps.items():
            for mod in (self.evidence.get("components", {}).get(name, {}).get("modules") or {}).values():
                if mod.get("realpath", "").endswith("__init__.py"):
                    roots[os.path.dirname(mod["realpath"]) + "/"] = name
        component_libs, other_libs = {}, {}
        for path in procfs.mapped_libraries():
            clean = path.removesuffix(" (deleted)")
            owner = owned.get(clean) or next((n for r, n in roots.items() if clean.startswith(r)), None)
            digest = procfs.sha256(clean) if clean == path else None
            if owner is None:
                other_libs[path] = digest
                continue
            expected = (comps[owner].get("native_libs") or {}).get(clean)
            component_libs[path] = {"component": owner, "sha256": digest, "manifest": expected}
            if expected is None:
                self.fail(f"{owner}: loaded native library {path} is not in the manifest's native_libs")
            elif digest != expected:
                self.fail(f"{owner}: loaded native library {path} sha256 {digest} differs from the manifest")
        self.evidence["native_libs_loaded"] = component_libs
        self.evidence["other_libs_loaded"] = other_libs


def _ignorable(path: str) -> bool:
    """RECORD entries with no content hash to compare: RECORD itself."""
    return path.endswith(".dist-info/RECORD")


def check(settings: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    checker = Checker(settings)
    checker.caches()  # before any import can create cache files
    checker.evidence["environment"] = {"numeric": numeric_env(), "recipe_env": settings.get("env") or {},
                                       "aligned_env": settings.get("aligned_env") or {},
                                       "control_env": settings.get("control_env") or {}}
    path = settings.get("manifest", "/opt/delivery/manifest.json")
    try:
        with open(path) as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as err:
        return "fail", f"manifest {path} missing or unreadable: {err}", checker.evidence
    site = manifest.get("site_packages") or ""
    checker.evidence["manifest"] = {"path": path, "sha256": procfs.sha256(path), "site_packages": site}
    checker.interpreter(manifest)
    checker.startup(manifest)
    table = checker.mounts(site)
    checker.evidence["components"] = {}
    for name, spec in (manifest.get("components") or {}).items():
        checker.evidence["components"][name] = checker.component(name, spec, site, table)
    if not manifest.get("components"):
        checker.fail(f"manifest {path} lists no components")
    checker.native(manifest)
    try:
        checker.evidence["gpu"] = gpu.facts()  # after the imports: torch is the components' own
    except Exception as err:  # noqa: BLE001 - a broken torch is recorded, the import checks above judge it
        checker.evidence["gpu"] = {"error": f"{err.__class__.__name__}: {err}"}
    checker.evidence["failures"] = checker.failures
    if checker.failures:
        more = f" (+{len(checker.failures) - 1} more)" if len(checker.failures) > 1 else ""
        return "fail", checker.failures[0] + more, checker.evidence
    count = sum(len(c.get("files") or {}) for c in manifest["components"].values())
    return ("pass", f"{len(manifest['components'])} components import from {site} with {count} manifest files and"
            f" {len(checker.evidence['native_libs_loaded'])} loaded native libs matching; " + (
                f"node-local JIT cache: {checker.evidence['jit_cache']['entries']} entries of this image"
                if checker.evidence.get("jit_cache") else "caches empty"),
            checker.evidence)
