"""Native build inputs in the lock: each component's FetchContent declarations (builder/sources/cmakefetch.py),
their GIT_TAG resolved to a commit through the mirror cache, exported once, written as lock lines.

    # cmake: vllm                  the component builds with CMake: its build gets the lock's native inputs
                                   through a toolchain file, FETCHCONTENT_FULLY_DISCONNECTED=ON
    # native: vllm tinykernels ../tinykernels.git ref=v0.1.0 commit=<40> tree=<40> export=<64> via=<VAR> at=<file:line>

A relative GIT_REPOSITORY is relative to the component's repository (CMake's CMP0150), so demo repositories
sit beside each other; url.<base>.insteadOf of the git config (BUILDER_GIT_CONFIG) applies to every fetch.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pygit2

from builder.core import log
from builder.core.constants import COMPONENTS
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import ResolvedComponent, ResolvedSources
from builder.pins.model import Component, Pins
from builder.sources import cmakefetch, mirror
from builder.sources import resolve as sources_mod

CMAKE_MARK = "# cmake: "
NATIVE_MARK = "# native: "
RELAXED_MARK = "# relaxed: "       # an exact torch pin relaxed to the base's torch (base_torch)
DIRECT_MARK = "# direct-url: "     # a `name @ url` requirement locked from the index (pins direct_urls)
RECORD_MARK = "# base-record: "    # <name> <version> <dist-info>/RECORD sha256=<hex>: checked in the image
RECORD_RX = re.compile(r"# base-record: (?P<name>[A-Za-z0-9._-]+) (?P<version>\S+) (?P<record>[A-Za-z0-9_.+-]+"
                       r"\.dist-info/RECORD) sha256=(?P<sha>[0-9a-f]{64})")
LINE_RX = re.compile(r"# native: (?P<component>[a-z]+) (?P<name>[A-Za-z0-9_.+-]+) (?P<url>\S+) ref=(?P<ref>\S+)"
                     r" commit=(?P<commit>[0-9a-f]{40}) tree=(?P<tree>[0-9a-f]{40}) export=(?P<export>[0-9a-f]{64})"
                     r" via=(?P<via>[A-Za-z0-9_.+-]+) at=(?P<at>\S+)(?: when: (?P<when>.*))?$")
FULL_SHA = re.compile(r"[0-9a-f]{40}")
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,99}")
SAFE_URL = re.compile(r"[A-Za-z0-9_.:/@%+~=-]{1,500}")
SAFE_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./+-]{0,200}")


@dataclass
class NativeInput:
    component: str
    name: str
    url: str            # GIT_REPOSITORY as written (variables resolved)
    ref: str            # GIT_TAG as written: a tag, a branch or a commit
    commit: str
    tree: str
    export_sha256: str
    receive: str        # how the build hands it to CMake: the project's *_SRC_DIR, else FETCHCONTENT_SOURCE_DIR_<NAME>
    declared: str       # file:line of the FetchContent_Declare
    when: list[str] = field(default_factory=list)  # conditions not decided statically

    def line(self) -> str:
        text = (f"{NATIVE_MARK}{self.component} {self.name} {self.url} ref={self.ref} commit={self.commit}"
                f" tree={self.tree} export={self.export_sha256} via={self.receive} at={self.declared}")
        return text + (f" when: {' AND '.join(self.when)}" if self.when else "")

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Locked:
    """What the lock text says about native builds."""
    cmake: list[str] = field(default_factory=list)   # components that build with CMake
    inputs: list[NativeInput] = field(default_factory=list)
    relaxed: list[str] = field(default_factory=list)
    direct: list[str] = field(default_factory=list)
    base_records: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> version, record, sha256

    def of(self, component: str) -> list[NativeInput]:
        return [i for i in self.inputs if i.component == component]


def parse(text: str, where: str = "lock") -> Locked:
    out = Locked()
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith(CMAKE_MARK):
            out.cmake.append(line[len(CMAKE_MARK):].strip())
        elif line.startswith(RELAXED_MARK):
            out.relaxed.append(line[len(RELAXED_MARK):].strip())
        elif line.startswith(DIRECT_MARK):
            out.direct.append(line[len(DIRECT_MARK):].strip())
        elif line.startswith(RECORD_MARK):
            record = RECORD_RX.fullmatch(line)
            if record is None:
                raise BadInput(f"{where}:{lineno}: expected '# base-record: <name> <version> <dist-info>/RECORD"
                               " sha256=<64 hex>'")
            out.base_records[record["name"]] = {"version": record["version"], "record": record["record"],
                                                "sha256": record["sha"]}
        elif line.startswith(NATIVE_MARK):
            match = LINE_RX.fullmatch(line)
            if match is None or match["component"] not in COMPONENTS:
                raise BadInput(f"{where}:{lineno}: expected '# native: <component> <name> <url> ref=... commit=<40 hex>"
                               " tree=<40 hex> export=<64 hex> via=<VAR> at=<file:line>', got a different line")
            out.inputs.append(NativeInput(match["component"], match["name"], match["url"], match["ref"], match["commit"],
                                          match["tree"], match["export"], match["via"], match["at"],
                                          match["when"].split(" AND ") if match["when"] else []))
    return out


def known_vars(pin: Component) -> dict[str, str]:
    """CMake variables that decide which inputs apply: the pins' cmake_vars and the target device."""
    native = pin.native
    if native is None:
        return {}
    known = dict(native.cmake_vars)
    if native.device is not None and native.device_var is not None:
        known[native.device_var] = native.device
    return known


def build_env(pins: Pins, name: str) -> dict[str, str]:
    """The environment of a component's build step (what `DEFINED ENV{...}` sees)."""
    return {**pins.build.env, **pins.components[name].build_env()}


def discover(settings: Settings, pins: Pins, name: str, resolved: ResolvedComponent) -> cmakefetch.Discovery:
    repo = mirror.open_mirror(settings, resolved.url)
    where = f"components.{name} ({resolved.commit[:12]})"
    try:
        return cmakefetch.discover_at(repo, resolved.commit, known_vars(pins.components[name]), build_env(pins, name))
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None


def _check(value: str, rx: re.Pattern[str], what: str, where: str) -> str:
    if not rx.fullmatch(value):
        raise BadInput(f"{where}: {what} {value[:80]!r}: expected {rx.pattern}")
    return value


def fetch_commit(settings: Settings, url: str, ref: str, where: str,
                 offline: bool = False) -> tuple[pygit2.Repository, pygit2.Commit]:
    """(mirror, commit) for a GIT_TAG: a full commit SHA as is, else a tag, else a branch of that name."""
    if FULL_SHA.fullmatch(ref):
        repo = mirror.ensure_commit(settings, url, ref, offline)
        obj = repo.get(ref)
        if obj is None:
            raise BadInput(f"{where}: commit {ref} not found in {mirror.looked_in(settings, url)}")
        return repo, obj.peel(pygit2.Commit)
    if re.fullmatch(r"[0-9a-f]{7,39}", ref):
        raise BadInput(f"{where}: GIT_TAG {ref}: an abbreviated commit cannot be fetched; expected the full 40-hex SHA")
    tag, branch = f"refs/tags/{ref}", f"refs/heads/{ref}"
    repo, found = mirror.sync(settings, url, {tag: tag, branch: f"refs/remotes/origin/{ref}"}, offline)
    target = found[tag] or found[branch]
    if target is None:
        hint = f" ({mirror.OFFLINE_HINT})" if offline else ""
        raise BadInput(f"{where}: GIT_TAG {ref}: no tag or branch of that name at {mirror.looked_in(settings, url)}{hint}")
    return repo, repo[target].peel(pygit2.Commit)


def resolve_input(settings: Settings, component: str, component_url: str, decl: cmakefetch.Declaration,
                  offline: bool = False) -> NativeInput:
    where = f"components.{component}: native input {decl.name} ({decl.file})"
    if decl.url:
        raise BadInput(f"{where}: URL {decl.url[:120]}: archive downloads are not supported; expected GIT_REPOSITORY"
                       " and GIT_TAG")
    if decl.direct and not decl.src_dir_env:
        raise BadInput(f"{where}: FetchContent_Populate({decl.name} GIT_REPOSITORY ...) populates directly, which"
                       f" ignores FETCHCONTENT_SOURCE_DIR_{decl.name.upper()}, and the project reads no variable of its"
                       " own for a local tree: an offline build cannot supply it")
    _check(decl.name, SAFE_NAME, "name", where)
    _check(decl.git_repository, SAFE_URL, "GIT_REPOSITORY", where)
    _check(decl.git_tag, SAFE_REF, "GIT_TAG", where)
    url = sources_mod.absolute_url(decl.git_repository, component_url)
    with log.step(f"lock: native input {component}/{decl.name} {decl.git_tag}"):
        repo, commit = fetch_commit(settings, url, decl.git_tag, where, offline)
        subs = sources_mod.submodules(settings, repo, commit, url, offline)
        stats = sources_mod.export_once(settings, repo, commit, subs)
    item = NativeInput(component, decl.name, decl.git_repository, decl.git_tag, str(commit.id), str(commit.tree_id),
                       stats.sha256, decl.receive, decl.file, decl.when)
    when = f"; only if {' AND '.join(decl.when)}" if decl.when else ""
    log.info(f"lock: native input {component}/{decl.name}: {decl.git_repository} GIT_TAG {decl.git_tag} -> commit"
             f" {item.commit} tree {item.tree[:12]}, {stats.files} files, received as {item.receive}"
             f" (declared at {decl.file}{when})")
    return item


def gather(settings: Settings, pins: Pins, sources: ResolvedSources, offline: bool = False) -> Locked:
    """Every component's native inputs for the device its pins name (each fetched, exported once)."""
    out = Locked()
    for name in COMPONENTS:
        resolved = sources.components[name]
        found = discover(settings, pins, name, resolved)
        if not found.cmake:
            continue
        out.cmake.append(name)
        for decl in found.declarations:
            out.inputs.append(resolve_input(settings, name, pins.component_url(name), decl, offline))
    return out


def lock_lines(locked: Locked) -> list[str]:
    return [f"{CMAKE_MARK}{name}" for name in locked.cmake] + [i.line() for i in locked.inputs]


def changes(old: Locked, new: Locked) -> list[str]:
    """What differs between the locked native inputs and the ones the pins give now, one line each."""
    before = {(i.component, i.name.lower()): i for i in old.inputs}
    after = {(i.component, i.name.lower()): i for i in new.inputs}
    out = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a is None and b is not None:
            out.append(f"native input {key[0]}/{b.name}: new ({b.url} GIT_TAG {b.ref} at {b.declared})")
        elif b is None and a is not None:
            out.append(f"native input {key[0]}/{a.name}: no longer declared")
        elif a is not None and b is not None and (a.url, a.ref, a.commit) != (b.url, b.ref, b.commit):
            what = f"GIT_TAG {a.ref} -> {b.ref}" if a.ref != b.ref else f"{a.ref}: commit {a.commit[:12]} -> {b.commit[:12]}"
            out.append(f"native input {key[0]}/{a.name}: {what}" + (f" ({b.url})" if a.url == b.url else f", {a.url} -> {b.url}"))
    if old.cmake != new.cmake:
        out.append(f"components building with CMake: {', '.join(old.cmake) or '-'} -> {', '.join(new.cmake) or '-'}")
    return out


def declared_changes(settings: Settings, pins: Pins, sources: ResolvedSources, old: Locked) -> list[str]:
    """`changes` for the declarations alone (name, GIT_REPOSITORY, GIT_TAG, which components use CMake),
    read at the pinned commits from the mirrors: no fetch, no export (the fast check before a build)."""
    now = Locked()
    locked = {(i.component, i.name.lower(), i.url, i.ref): i.commit for i in old.inputs}
    for name in COMPONENTS:
        found = discover(settings, pins, name, sources.components[name])
        if found.cmake:
            now.cmake.append(name)
        for decl in found.declarations:
            commit = locked.get((name, decl.name.lower(), decl.git_repository, decl.git_tag), "")
            now.inputs.append(NativeInput(name, decl.name, decl.git_repository, decl.git_tag, commit, "", "",
                                          decl.receive, decl.file, decl.when))
    return changes(old, now)


def export_file(settings: Settings, pins: Pins, item: NativeInput) -> Path:
    """The export of a locked input (made again from the mirror if this cache lacks it), checked."""
    path = sources_mod.export_path(settings, item.export_sha256)
    if path.is_file():
        return path
    url = sources_mod.absolute_url(item.url, pins.component_url(item.component))
    repo, commit = fetch_commit(settings, url, item.commit, f"native input {item.component}/{item.name}")
    stats = sources_mod.export_once(settings, repo, commit, sources_mod.submodules(settings, repo, commit, url, False))
    if stats.sha256 != item.export_sha256:
        raise BadInput(f"native input {item.component}/{item.name}: export of {item.commit} has sha256 {stats.sha256},"
                       f" the lock says {item.export_sha256}")
    return path
