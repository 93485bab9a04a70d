"""`builder lock PINS [--check]`: the hashed, offline wheel closure to build and run the three components.

    base (network-none container)  -> interpreter, ABI, glibc, installed distributions (kept as they are)
    each component at its pinned commit -> [build-system].requires (from the git blob), its VCS version
    build requirements -> resolved for the base, wheels downloaded
    metadata -> prepared in a network-none base container with those wheels (pip, no build isolation,
                so setup.py / dynamic metadata work), giving Requires-Dist
    runtime closure -> resolved against the base; build-only closure -> resolved against base + runtime
    sdist-only dependencies -> built in a network-none base container (--build-sdists) or an error
    lock text (sorted, byte-identical for the same inputs) -> the pins' build.lock; wheels -> the wheelhouse

Lines marked `# build:` are needed only while building (installed in the build stage, never in the
image). The header's inputs-sha256 covers everything the lock depends on; `--check` recomputes it.
"""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from builder.core import log, resources
from builder.core.constants import COMPONENTS, SOURCE_DATE_EPOCH
from builder.core.errors import BadInput, BuildFailed, StaleLock
from builder.core.files import sha256_file
from builder.core.options import Settings
from builder.core.records import ResolvedComponent, ResolvedSources
from builder.engine import basecontainer
from builder.engine.basecontainer import WORK, BaseInfo
from builder.lock import download, native, record, resolver, wheels
from builder.lock.resolver import Target
from builder.lock.wheels import BUILD_MARK
from builder.pins import model as pins_mod
from builder.pins.model import Pins
from builder.sources import mirror, scmversion
from builder.sources.resolve import exported_tar

FORMAT = 1
LEGACY_REQUIRES = ["setuptools>=40.8.0"]  # PEP 517: no [build-system] means setuptools' legacy backend
BUILT_MARK = wheels.BUILT_MARK  # the note on a wheel built from an sdist (wheels.built_from_sdist reads it)
TORCH_NAMES = ("torch", "torchvision", "torchaudio")  # what base_torch relaxes (vLLM's tools/use_existing_torch.py)
# build-only tools a component may need in another version than the base has: they go into the
# build-tools prefix (importable and on PATH while components build), never into the image
BUILD_TOOLS = ("setuptools", "cmake", "ninja", "setuptools-scm", "setuptools-rust")


@dataclass
class ComponentInputs:
    name: str
    distribution: str
    version: str = ""
    scm_version: str = ""
    build_requires: list[str] = field(default_factory=list)
    requires_dist: list[str] = field(default_factory=list)
    tools_over_base: list[str] = field(default_factory=list)  # BUILD_TOOLS the base has in a version not wanted


@dataclass
class Adjust:
    """How a component's requirements are adjusted before locking, and the notes the lock writes about it."""
    base_torch: bool = False
    direct: dict[str, str] = field(default_factory=dict)  # canonical name -> version (pins direct_urls)
    notes: list[str] = field(default_factory=list)        # "relaxed: ..." / "direct-url: ..." lines


@dataclass
class LockResult:
    path: Path
    text: str
    sha256: str
    inputs_sha256: str
    wheels: int
    wheelhouse: Path | None


# --------------------------------------------------------------------------- requirements


def _parse(req: str, where: str) -> Requirement:
    try:
        return Requirement(req)
    except InvalidRequirement as exc:
        raise BadInput(f"{where}: expected a PEP 508 requirement, got {req!r} ({exc})") from None


def applicable(reqs: list[str], base: BaseInfo, where: str, skip: set[str], adjust: Adjust | None = None,
               runtime: bool = False) -> list[str]:
    """Requirements whose markers hold on the base (no extras), markers dropped, components left out;
    a direct URL mapped by the pins' direct_urls, exact torch pins relaxed with base_torch (adjust), and
    with it a runtime pin on a build tool the base has in another version (vLLM's cpu requirements pin
    setuptools==78.1.1 at runtime: the base's runtime distributions stay as they are)."""
    out = []
    for text in reqs:
        req = _parse(text, where)
        if req.marker is not None and not req.marker.evaluate({**base.markers, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in skip:
            continue
        req.marker = None
        if req.url:
            version = adjust.direct.get(name) if adjust else None
            if version is None or adjust is None:
                raise BadInput(f"{where}: {text!r}: a direct URL requirement cannot be locked by hash; expected"
                               f" name[extras] and a version specifier, or a direct_urls entry mapping {req.name}"
                               " to a version from the index, with a reason")
            req.url, req.specifier = None, SpecifierSet(f"=={version}")
            adjust.notes.append(f"{native.DIRECT_MARK}{where}: {text} -> {req}")
        have = {canonicalize_name(n): v for n, v in base.dists.items()}.get(name)
        relaxable = name in TORCH_NAMES or (runtime and name in BUILD_TOOLS)
        if adjust and adjust.base_torch and relaxable and have is not None and req.specifier \
                and not req.specifier.contains(have, prereleases=True):
            before = str(req)
            req.specifier = SpecifierSet()
            adjust.notes.append(f"{native.RELAXED_MARK}{where}: {before} -> {req} (the base's {req.name} {have})")
        out.append(str(req))
    return sorted(set(out))


def tools_over_base(reqs: list[str], provided: dict[str, str]) -> list[str]:
    """BUILD_TOOLS a build requirement wants in a version the base does not have."""
    versions = {canonicalize_name(n): v for n, v in provided.items()}
    out = set()
    for text in reqs:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        have = versions.get(name)
        if name in BUILD_TOOLS and have is not None and not req.specifier.contains(have, prereleases=True):
            out.add(name)
    return sorted(out)


def without(provided: dict[str, str], names: list[str]) -> dict[str, str]:
    return {n: v for n, v in provided.items() if canonicalize_name(n) not in names}


def check_against(reqs: list[str], provided: dict[str, str], where: str, what: str) -> None:
    """A requirement on a provided distribution that the provided version does not satisfy is an error."""
    versions = {canonicalize_name(n): v for n, v in provided.items()}
    for text in reqs:
        req = Requirement(text)
        have = versions.get(canonicalize_name(req.name))
        if have is not None and not req.specifier.contains(have, prereleases=True):
            raise BadInput(f"{where}: requires {text!r} but {what} provides {req.name} {have}"
                           " (the base is never upgraded or replaced)")


# --------------------------------------------------------------------------- per component


def _pyproject(settings: Settings, component: ResolvedComponent) -> dict[str, Any]:
    repo = mirror.open_mirror(settings, component.url)
    return scmversion.pyproject_at(repo, component.commit) or {}


def build_requires(pyproject: dict[str, Any]) -> list[str]:
    system = pyproject.get("build-system")
    if system is None:
        return list(LEGACY_REQUIRES)
    requires = system.get("requires")
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise BadInput("pyproject.toml: [build-system].requires: expected a list of requirement strings")
    return list(requires)


LOCK_SCRIPT = resources.container_script("lock", "lock_in_base.py")  # metadata / sdist modes, in a base container


def static_metadata(pyproject: dict[str, Any]) -> dict[str, Any] | None:
    """Name, version and Requires-Dist straight from [project] when none of them is dynamic: PEP 621
    says a backend must then produce exactly these, so no build is needed to know them."""
    project = pyproject.get("project")
    if not isinstance(project, dict) or not {"name", "version"} <= set(project):
        return None
    if {"name", "version", "dependencies"} & set(project.get("dynamic", [])):
        return None
    return {"name": project["name"], "version": project["version"],
            "requires_dist": list(project.get("dependencies", []))}


def metadata_cache(settings: Settings, pins: Pins, component: ResolvedComponent, inputs: ComponentInputs) -> Path:
    """Where a component's prepared metadata is kept: by base digest, the export of its commit, its VCS
    version and its build requirements (as written, so a hit needs no resolve)."""
    key = hashlib.sha256(json.dumps(["metadata/2", pins.base.image, component.export_sha256, inputs.scm_version,
                                     inputs.build_requires,
                                     "--ignore-requires-python" in pins.components[inputs.name].install.pip_args]
                                    ).encode()).hexdigest()
    return settings.cache("lock", "metadata") / f"{key[:32]}.json"


def known_metadata(settings: Settings, pins: Pins, component: ResolvedComponent, inputs: ComponentInputs,
                   pyproject: dict[str, Any]) -> dict[str, Any] | None:
    """The metadata without a container: static [project] fields, or prepared before (the cache)."""
    static = static_metadata(pyproject)
    if static is not None:
        log.info(f"lock: metadata of {inputs.name}: static in pyproject.toml [project]")
        return static
    cached = metadata_cache(settings, pins, component, inputs)
    if cached.is_file():
        data: dict[str, Any] = json.loads(cached.read_text())
        return data
    return None


def prepare_metadata(settings: Settings, pins: Pins, component: ResolvedComponent, inputs: ComponentInputs,
                     build_wheels: list[Path]) -> dict[str, Any]:
    """Prepare the metadata in a network-none base container with its build requirements (setup.py,
    requirements files, VCS versions) and keep it in the cache."""
    files = {f"{WORK.lstrip('/')}/wheels/{p.name}": p.read_bytes() for p in build_wheels}
    env = {"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
    if "--ignore-requires-python" in pins.components[inputs.name].install.pip_args:
        env["LOCK_IGNORE_REQUIRES_PYTHON"] = "1"  # the install will pass it too (pins' pip_args)
    if inputs.scm_version:
        env.update(scmversion.pretend_env(inputs.distribution, inputs.scm_version))
    with log.step(f"lock: metadata of {inputs.name} (network-none base container)"):
        archives = [("/", basecontainer.tar_bytes(files, (f"{WORK.lstrip('/')}/src",))),
                    (f"{WORK}/src", exported_tar(settings, component).read_bytes())]
        result = basecontainer.run(settings, pins.base.image, pins.base.python_bin, LOCK_SCRIPT, archives, env,
                                   log_name=f"lock-metadata-{inputs.name}", args=["metadata"])
    if result.rc != 0:
        raise basecontainer.failure(result, f"components.{inputs.name}", "preparing metadata", pins.base.python)
    data: dict[str, Any] = result.payload()
    metadata_cache(settings, pins, component, inputs).write_text(json.dumps(data, sort_keys=True))
    return data


def use_metadata(component: ResolvedComponent, inputs: ComponentInputs, data: dict[str, Any]) -> None:
    """Check the metadata against the pins and fill inputs.version / requires_dist from it."""
    if canonicalize_name(data["name"]) != canonicalize_name(inputs.distribution):
        raise BadInput(f"components.{inputs.name}.distribution: pinned {inputs.distribution!r}, the"
                       f" package at {component.commit[:12]} is {data['name']!r}")
    if inputs.scm_version and not scmversion.same_version(data["version"], inputs.scm_version):
        raise BuildFailed(f"components.{inputs.name}: built version {data['version']} != VCS version"
                          f" {inputs.scm_version} ({scmversion.pretend_env_name(inputs.distribution)} not honoured)")
    inputs.version = data["version"]
    inputs.requires_dist = sorted(data["requires_dist"])


# --------------------------------------------------------------------------- sdists




def _sdist_requires(sdist: Path) -> list[str]:

    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if member.name.count("/") == 1 and member.name.endswith("/pyproject.toml"):
                data = tomllib.loads(tar.extractfile(member).read().decode())  # type: ignore[union-attr]
                return build_requires(data)
    return list(LEGACY_REQUIRES)


def build_sdist(settings: Settings, pins: Pins, base: BaseInfo, target: Target, name: str, version: str,
                resolver_name: str) -> tuple[Path, str]:
    """(wheel built in a network-none base container, sha256 of the sdist it came from); cached by that sha256."""
    sdist = resolver.download_sdist(settings, name, version)
    sdist_sha = sha256_file(sdist)
    out = settings.cache("wheels", "built", f"{sdist_sha[:16]}-{base.abi}-{base.machine}")
    built = sorted(out.glob("*.whl"))
    if built:
        return built[0], sdist_sha
    reqs = applicable(_sdist_requires(sdist), base, f"{sdist.name}:pyproject.toml", set())
    pinned = resolver.resolve(settings, reqs, base.dists, target, resolver_name, log_name=f"lock-resolve-sdist-{name}")
    found, missing = resolver.download_wheels(settings, pinned, target)
    if missing:
        raise BadInput(f"{sdist.name}: its build requirements have no wheels for the base: {', '.join(missing)}")
    files = {f"{WORK.lstrip('/')}/wheels/{p.name}": p.read_bytes() for p in found.values()}
    files[f"{WORK.lstrip('/')}/sdist/{sdist.name}"] = sdist.read_bytes()
    with log.step(f"lock: build {sdist.name} (network-none base container)"):
        result = basecontainer.run(settings, pins.base.image, pins.base.python_bin, LOCK_SCRIPT,
                                   [("/", basecontainer.tar_bytes(files))], {"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)},
                                   fetch=f"{WORK}/out", log_name=f"lock-sdist-{name}", args=["sdist"])
    if result.rc != 0:
        raise basecontainer.failure(result, sdist.name, "building a wheel", pins.base.python)
    with tarfile.open(fileobj=io.BytesIO(result.archive)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".whl"):
                (out / Path(member.name).name).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    built = sorted(out.glob("*.whl"))
    if not built:
        raise BuildFailed(f"{sdist.name}: the base build produced no wheel")
    return built[0], sdist_sha


# --------------------------------------------------------------------------- the lock


def inputs_sha256(base: BaseInfo, target: Target, comps: list[ComponentInputs], compat: list[str] | None = None,
                  locked: native.Locked | None = None, notes: list[str] | None = None) -> str:
    data: dict[str, Any] = {"format": FORMAT, "base_dists": base.dists, "target": target.__dict__,
                            "components": [{k: v for k, v in c.__dict__.items() if v or k != "tools_over_base"}
                                           for c in comps]}
    if compat:
        data["compat"] = compat
    if locked is not None and (locked.cmake or locked.inputs):
        data["native"] = {"cmake": locked.cmake,
                          "inputs": [[i.component, i.name, i.url, i.ref, i.commit] for i in locked.inputs]}
    if notes:
        data["notes"] = notes
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=list).encode()).hexdigest()


def compat_requirements(pins: Pins, base: BaseInfo) -> list[str]:
    """The pins' compat entries the lock carries as `package==version`: all but the components
    themselves and what the base provides (where a different version is an error)."""
    names = {canonicalize_name(pins.components[n].distribution) for n in COMPONENTS}
    reqs = sorted(f"{c.package}=={c.version}" for c in pins.compat if canonicalize_name(c.package) not in names)
    check_against(reqs, base.dists, "compat", f"the base {pins.base.image}")
    base_names = {canonicalize_name(n) for n in base.dists}
    return [r for r in reqs if canonicalize_name(r.split("==", 1)[0]) not in base_names]


def check_base_torch(pins: Pins, base: BaseInfo) -> None:
    """`base_torch: true` keeps the base's torch: a base without one is bad input, said before anything is
    installed (else the build requirements would bring the index's torch into the metadata container)."""
    if "torch" in {canonicalize_name(n) for n in base.dists}:
        return
    for name in COMPONENTS:
        if pins.components[name].base_torch:
            raise BadInput(f"components.{name}.base_torch: true, but the base has no torch ({pins.base.python_bin}"
                           f" in {pins.base.image} lists no torch distribution); expected a base with torch"
                           " installed, or base_torch: false")


def gather(settings: Settings, pins: Pins, sources: ResolvedSources, base: BaseInfo, target: Target,
           resolver_name: str, adjusts: dict[str, Adjust] | None = None) -> list[ComponentInputs]:
    """Per component: build requirements, VCS version, and metadata (static, cached by commit and base
    digest, or prepared in base containers, the three in parallel); `adjusts` collects each component's
    relaxed torch pins and mapped direct URLs."""
    adjusts = {} if adjusts is None else adjusts
    check_base_torch(pins, base)  # before any container installs anything
    comps, todo = [], []
    names: set[str] = {canonicalize_name(pins.components[n].distribution) for n in COMPONENTS}
    for name in COMPONENTS:
        pin, resolved = pins.components[name], sources.components[name]
        where = f"components.{name} ({pin.distribution} at {pin.commit[:12]})"
        pyproject = _pyproject(settings, resolved)
        adjust = adjusts.setdefault(name, Adjust(pin.base_torch, {canonicalize_name(d.package): d.version
                                                                 for d in pins.direct_urls}))
        inputs = ComponentInputs(name=name, distribution=pin.distribution,
                                 scm_version=getattr(resolved, "version", "") or "",
                                 build_requires=applicable(build_requires(pyproject), base, f"{where}: build-system",
                                                           set(), adjust))
        inputs.tools_over_base = tools_over_base(inputs.build_requires, base.dists)
        check_against([r for r in inputs.build_requires
                       if canonicalize_name(Requirement(r).name) not in inputs.tools_over_base],
                      base.dists, f"{where}: [build-system].requires", f"the base {pins.base.image}")
        data = known_metadata(settings, pins, resolved, inputs, pyproject)
        if data is None:
            todo.append((resolved, inputs, where))
        else:
            use_metadata(resolved, inputs, data)
        comps.append(inputs)

    def prepare(resolved: ResolvedComponent, inputs: ComponentInputs, where: str) -> dict[str, Any]:
        pinned = resolver.resolve(settings, inputs.build_requires, without(base.dists, inputs.tools_over_base), target,
                                  resolver_name, log_name=f"lock-resolve-build-{inputs.name}")
        found, missing = resolver.download_wheels(settings, pinned, target)
        if missing:
            raise BadInput(f"{where}: build requirements with no wheel for the base: {', '.join(missing)}")
        return prepare_metadata(settings, pins, resolved, inputs, [found[n] for n in sorted(found)])

    if todo:  # the components' build requirements and metadata containers side by side
        with resolver.spent("metadata in base containers"), \
                ThreadPoolExecutor(max_workers=len(todo)) as pool:
            jobs = [(resolved, inputs, pool.submit(prepare, resolved, inputs, where)) for resolved, inputs, where in todo]
            for resolved, inputs, job in jobs:
                use_metadata(resolved, inputs, job.result())
    for inputs in comps:
        where = f"components.{inputs.name} ({inputs.distribution} at {pins.components[inputs.name].commit[:12]})"
        inputs.requires_dist = applicable(inputs.requires_dist, base, f"{where}: Requires-Dist", names,
                                          adjusts[inputs.name], runtime=True)
        check_against(inputs.requires_dist, base.dists, f"{where}: Requires-Dist", f"the base {pins.base.image}")
    provided = {c.distribution: c.version for c in comps}
    for c in comps:
        check_against(c.requires_dist, provided, f"components.{c.name}: Requires-Dist", "the stack")
    return comps


def _resolve_all(settings: Settings, reqs_of: dict[str, list[str]], provided: dict[str, str], target: Target, resolver_name: str,
                 what: str) -> dict[str, str]:
    """Resolve the union; on failure name the component whose requirements fail on their own."""
    everything = sorted({r for reqs in reqs_of.values() for r in reqs})
    try:
        return resolver.resolve(settings, everything, provided, target, resolver_name, log_name=f"lock-resolve-{what}")
    except BadInput as exc:
        for name, reqs in reqs_of.items():
            try:
                resolver.resolve(settings, reqs, provided, target, resolver_name, log_name=f"lock-resolve-{what}-{name}")
            except BadInput as alone:
                raise BadInput(f"components.{name}: {what} requirements conflict with the base: {alone}") from None
        for a, b in itertools.combinations(reqs_of, 2):  # each resolves alone: which two wanted what
            try:
                resolver.resolve(settings, sorted({*reqs_of[a], *reqs_of[b]}), provided, target, resolver_name,
                                 log_name=f"lock-resolve-{what}-{a}-{b}")
            except BadInput as pair:
                wants = who_wants(str(pair), {a: reqs_of[a], b: reqs_of[b]})
                raise BadInput(f"components.{a} and components.{b}: {what} requirements conflict"
                               f"{': ' + wants if wants else ''} ({pair})") from None
        raise BadInput(f"{what} requirements of the three components conflict with each other or the base: {exc}") from None


def _req_name(text: str) -> str:
    try:
        return Requirement(text).name
    except InvalidRequirement:
        return ""


def who_wants(explanation: str, reqs_of: dict[str, list[str]]) -> str:
    """'a wants x>=1; b wants x<1': each side's own requirements on the distributions the resolver names."""
    named = {canonicalize_name(m) for m in re.findall(r"[A-Za-z0-9][A-Za-z0-9._-]*", explanation)}
    parts = []
    for name, reqs in reqs_of.items():
        mine = [r for r in reqs if canonicalize_name(_req_name(r)) in named]
        if mine:
            parts.append(f"{name} wants {', '.join(sorted(mine))}")
    return "; ".join(parts) if len(parts) == len(reqs_of) else ""


def compute(settings: Settings, pins: Pins, sources: ResolvedSources, resolver_name: str = "uv",
            build_sdists: bool = False, offline: bool = False) -> tuple[str, dict[str, Path]]:
    """(lock text, {wheel file name: path}) for the pins."""
    with log.step("lock: read the base (network-none container)"), resolver.spent("read the base"):
        base = basecontainer.read_base(settings, pins.base.image, pins.base.python_bin, pins.base.python,
                                       pins.base.platform)
    target = Target.of(base)
    adjusts: dict[str, Adjust] = {}
    comps = gather(settings, pins, sources, base, target, resolver_name, adjusts)
    notes = [n for name in COMPONENTS for n in adjusts[name].notes]
    locked = native.gather(settings, pins, sources, offline)
    provided = {**base.dists, **{c.distribution: c.version for c in comps}}
    tools = sorted({t for c in comps for t in c.tools_over_base})
    with log.step(f"lock: resolve runtime closure ({resolver_name})"):
        compat = compat_requirements(pins, base)
        wanted = {c.name: c.requires_dist for c in comps} | ({"compat": compat} if compat else {})
        runtime = _resolve_all(settings, wanted, provided, target, resolver_name, "runtime")
    with log.step(f"lock: resolve build closure ({resolver_name})"):
        build = _resolve_all(settings, {c.name: c.build_requires for c in comps}, without({**provided, **runtime}, tools),
                             target, resolver_name, "build")
    pinned = {**runtime, **build}
    with ThreadPoolExecutor(max_workers=1) as builder_pool:
        building: dict[str, Any] = {}

        def start_sdist(name: str) -> None:  # while the other wheels download
            if build_sdists and name not in building:
                building[name] = builder_pool.submit(build_sdist, settings, pins, base, target, name, pinned[name],
                                                     resolver_name)

        with log.step(f"lock: wheels for {base.python} {base.abi} {target.uv_platform()}"):
            found, no_wheel = resolver.download_wheels(settings, pinned, target, start_sdist)
        built: dict[str, str] = {}
        if no_wheel and not build_sdists:
            raise BadInput(f"{pins.path}: {len(no_wheel)} dependencies have only an sdist for the base"
                           f" ({', '.join(sorted(no_wheel))}); pass --build-sdists to build them in a"
                           " network-none base container, or pin versions with wheels")
        with resolver.spent("sdists built in base containers"):
            for req in sorted(no_wheel):
                name, version = req.split("==", 1)
                start_sdist(name)
                found[name], built[name] = building[name].result()
    header = [
        "# Written by `builder lock`; do not edit. Regenerate with `builder lock PINS`, verify with --check.",
        f"# format: {FORMAT}",
        f"# inputs-sha256: {inputs_sha256(base, target, comps, compat, locked, notes)}",
        record.for_line(pins),
        f"# base: {pins.base.name} (what it provides is read from it; its digest is in the pins)",
        f"# target: python {base.python} {base.abi} {target.uv_platform()} (read from the base)",
        f"# resolver: {resolver.resolver_version(resolver_name)}",
        f"# index: {resolver.shown_index(settings.index_url)}{resolver.shown_links(settings.find_links)}"
        " (only; the host's pip configuration does not apply)",
        f"# base provides {len(base.dists)} distributions (kept as they are, never in this lock)",
    ]
    if compat:
        header.append(f"# compat (from the pins): {', '.join(compat)}")
    for c in comps:
        how = f" (from VCS: {scmversion.pretend_env_name(c.distribution)})" if c.scm_version else ""
        header.append(f"# {c.name}: {c.distribution} {c.version}{how}; build-system.requires:"
                      f" {', '.join(c.build_requires) or '-'}")
    if tools:
        header.append(f"# build tools over the base's (build-tools prefix only, never in the image): {', '.join(tools)}")
    header += notes + native.lock_lines(locked)
    header += [f"{native.RECORD_MARK}{name} {version} {record} sha256={sha}"
               for name, (version, record, sha) in sorted(base.records.items())]
    lines = []
    with resolver.spent("sha256 of the wheels"):
        hashes = {name: sha256_file(found[name]) for name in pinned}
    for name in sorted(pinned):
        path = found[name]
        note = f"{path.name} {BUILT_MARK} sha256 {built[name]}" if name in built else path.name
        mark = BUILD_MARK if name not in runtime else "# "
        lines.append(f"{name}=={pinned[name]} --hash=sha256:{hashes[name]}  {mark}{note}")
    if not lines:
        lines.append("# (no wheels: the base provides everything)")
    return "\n".join(header + lines) + "\n", {found[n].name: found[n] for n in pinned}


def fill_wheelhouse(settings: Settings, pins: Pins, lock: record.Lock, files: dict[str, Path]) -> Path | None:
    """Put the lock's wheels where the build looks for them (wheels.wheelhouse), then let
    wheels.ensure_wheels check them against the lock's hashes."""
    if not lock.entries:
        return None
    target = wheels.Target.from_base(pins.base.python, pins.base.platform)
    dest = wheels.wheelhouse(lock.wheel_key, target, settings)
    for name, path in sorted(files.items()):
        if not (dest / name).exists():
            tmp = dest / f".{name}.part"
            try:
                os.link(path, tmp)  # the pool and the wheelhouse share the bytes (same cache file system)
            except OSError:
                shutil.copyfile(path, tmp)
            os.replace(tmp, dest / name)
    return wheels.ensure_wheels(lock.path, lock.text, lock.wheel_key, target, settings)


def recorded_inputs(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("# inputs-sha256: "):
            return line.split(": ", 1)[1].strip()
    return ""


def check_resolver(name: str) -> None:
    if name not in resolver.RESOLVERS:
        raise BadInput(f"--resolver: expected one of {', '.join(resolver.RESOLVERS)}, got {name!r}")


def lock(pins: Pins, sources: ResolvedSources, settings: Settings, check: bool = False, resolver_name: str = "uv",
         build_sdists: bool = False, offline: bool = False, upgrade: bool = False,
         started: float | None = None) -> LockResult:
    """Write (or with check, verify) the lock of a pins file. A lock written for the same inputs (commits,
    base, requirements, compat, native inputs) by the same resolver is kept as it is, its wheels checked,
    unless `upgrade` (resolve again, taking newer releases). `started`: when the lock began (sources
    resolved before), for the time table it prints at the end."""
    check_resolver(resolver_name)
    resolver.SPENT.clear()
    download.TOTALS.reset()
    if started is None:
        started = time.monotonic()
    elif "lock: resolve sources" in log.timings:
        resolver.SPENT["resolve sources (git)"] = log.timings["lock: resolve sources"]
    path = pins.lock_path()
    old = path.read_text() if path.is_file() else ""
    if check:
        current = record.parse(old, path)
        want = check_inputs(settings, pins, sources, current, resolver_name, offline)
        return LockResult(path, old, current.sha256, want, len(current.entries), None)
    kept = None if upgrade else unchanged(settings, pins, sources, old, resolver_name, offline)
    text, files = kept if kept is not None else compute(settings, pins, sources, resolver_name, build_sdists, offline)
    if text != old:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as fh:
            fh.write(text)
        os.replace(fh.name, path)
    with resolver.spent("wheelhouse (copy, check)"):
        wheelhouse = fill_wheelhouse(settings, pins, record.parse(text, path), files)
    count = sum(1 for line in text.splitlines() if "--hash=" in line)
    log.info(f"lock: {path} ({count} wheels, sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]})")
    log.info(time_table(time.monotonic() - started))
    return LockResult(path, text, hashlib.sha256(text.encode()).hexdigest(), recorded_inputs(text), count, wheelhouse)


def unchanged(settings: Settings, pins: Pins, sources: ResolvedSources, old: str, resolver_name: str, offline: bool = False
              ) -> tuple[str, dict[str, Path]] | None:
    """(old lock, {}) when it was written for the same inputs by the same resolver and its wheelhouse
    holds every locked wheel, else None (resolve)."""
    if not old or f"# resolver: {resolver.resolver_version(resolver_name)}\n" not in old:
        return None
    with log.step("lock: inputs (metadata cached by commit and base digest)"):
        with resolver.spent("read the base"):
            base = basecontainer.read_base(settings, pins.base.image, pins.base.python_bin, pins.base.python,
                                           pins.base.platform)
        target = Target.of(base)
        locked = native.gather(settings, pins, sources, offline)
        adjusts: dict[str, Adjust] = {}
        comps = gather(settings, pins, sources, base, target, resolver_name, adjusts)
        want = inputs_sha256(base, target, comps, compat_requirements(pins, base), locked,
                             [n for name in COMPONENTS for n in adjusts[name].notes])
    if want != recorded_inputs(old):
        return None
    current = record.parse(old, pins.lock_path())
    dest = wheels.wheelhouse(current.wheel_key, wheels.Target.from_base(pins.base.python, pins.base.platform), settings)
    with resolver.spent("sha256 of the wheels"):
        found = wheels.match_files(dest, list(current.entries)) if current.entries else {}
    if found is None:  # a new cache: resolve, download and build again (wheels built from sdists are nowhere else)
        return None
    log.info(f"lock: inputs unchanged (sha256 {want[:16]}): kept {pins.lock_path()}; --upgrade resolves again")
    return with_for_line(old, pins), {}


def with_for_line(text: str, pins: Pins) -> str:
    """The lock text with its `# for:` line naming these pins' commits and base (the inputs are the same)."""
    lines = [ln for ln in text.splitlines() if not ln.startswith(record.FOR_MARK)]
    at = next((i + 1 for i, ln in enumerate(lines) if ln.startswith("# inputs-sha256: ")), 0)
    return "\n".join([*lines[:at], record.for_line(pins), *lines[at:]]) + "\n"


def check_inputs(settings: Settings, pins: Pins, sources: ResolvedSources, lock: record.Lock,
                 resolver_name: str = "uv", offline: bool = False) -> str:
    """`builder lock --check`: StaleLock naming the first native input that changed, else comparing the
    inputs-sha256 the pins give now with the lock's; returns it."""
    with log.step("lock: read the base (network-none container)"):
        base = basecontainer.read_base(settings, pins.base.image, pins.base.python_bin, pins.base.python,
                                       pins.base.platform)
    target = Target.of(base)
    locked = native.gather(settings, pins, sources, offline)  # first: cheap, and names what changed
    changed = native.changes(lock.native, locked)
    if changed:
        raise StaleLock(record.stale_message(lock.path, changed, pins.path))
    adjusts: dict[str, Adjust] = {}
    comps = gather(settings, pins, sources, base, target, resolver_name, adjusts)
    want = inputs_sha256(base, target, comps, compat_requirements(pins, base), locked,
                         [n for name in COMPONENTS for n in adjusts[name].notes])
    if want != lock.inputs_sha256:
        raise StaleLock(record.stale_message(
            lock.path, [f"the pins' inputs are sha256 {want[:16]}, the lock was written for"
                        f" {lock.inputs_sha256[:16] or 'nothing (no inputs-sha256 line)'}"], pins.path))
    return want


def check_fresh(settings: Settings, pins: Pins, sources: ResolvedSources, lock: record.Lock,
                offline: bool = False) -> None:
    """Before render, build and run: StaleLock (the line `--check` prints) when the lock does not fit the
    pins. Fast: the native-input declarations at the pinned commits (git only); only when a commit or the
    base digest is not the one the lock was written for (its `# for:` line), the inputs check."""
    changed = native.declared_changes(settings, pins, sources, lock.native)
    if changed:
        raise StaleLock(record.stale_message(lock.path, changed, pins.path))
    if record.moved(lock, pins):
        check_inputs(settings, pins, sources, lock, offline=offline)


def time_table(total: float) -> str:
    """Where a lock's time went: its parts (resolver.SPENT), downloads apart (time, volume, files)."""
    spent = dict(resolver.SPENT)
    dl = download.TOTALS
    wheels_s = spent.pop("wheels: pool and downloads", 0.0)
    spent["wheels: pool (downloads apart)"] = max(0.0, wheels_s - dl.seconds)
    rows = [f"  {what:<34} {seconds:7.2f} s" for what, seconds in sorted(spent.items(), key=lambda kv: -kv[1])]
    rows.append(f"  {'other':<34} {max(0.0, total - sum(spent.values()) - dl.seconds):7.2f} s")
    return "\n".join(["lock: where the time went", *rows,
                      f"  {'total without downloads':<34} {total - dl.seconds:7.2f} s",
                      f"  {'downloads':<34} {dl.seconds:7.2f} s  {dl.files} wheels, {dl.bytes / 1e6:.1f} MB"
                      f" ({download.WORKERS} in parallel)",
                      f"  {'total':<34} {total:7.2f} s"])


def start_lock_file(pins_path: Path) -> None:
    """A first `builder lock` creates the pins' build.lock (pins validation wants it to exist)."""

    try:
        data = pins_mod.read_yaml(pins_path.read_text())
        rel = data["build"]["lock"]
    except Exception:  # noqa: BLE001 - pins_mod.load reports what is wrong with the file
        return
    if not isinstance(rel, str) or not pins_mod._match("rel_path", rel):
        return
    try:
        path = (pins_path.resolve().parent / rel).resolve()
        if pins_path.resolve().parent in path.parents and not path.exists() and path.parent.is_dir():
            path.write_text("# not locked yet: run `builder lock PINS`\n")
    except (OSError, RuntimeError):  # a symlink loop, a path too long: pins_mod.load names it in one line
        return
