"""`builder resolve PINS`: map each pinned PR commit to its mirror, check it, and record it.

For vllm, megatron and verl: fetch the target branch and refs/pull/<N>/head into the mirror,
require the pinned commit to be the PR head (or, with allow_moved_pr, an older commit of the
PR: reachable from its head and not from the target branch),
record merge-base/ahead/behind against the target tip, the submodule gitlinks (each fetched
into its own mirror, recursively), and the sha256 + file count of the deterministic export.

Each tree is exported once per run: the export is kept as `<cache>/exports/<sha256>.tar`, and the
build context reads that same file (`export_path`).
"""
from __future__ import annotations

import posixpath
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pygit2

from builder.core import files as fs
from builder.core import log
from builder.core.constants import COMPONENTS
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import ResolvedComponent, ResolvedSources, Submodule
from builder.pins.model import Component, Pins
from builder.sources import mirror, scmversion
from builder.sources import treetar as export

MAX_DEPTH = 8  # submodule nesting


def resolve(pins: Pins, settings: Settings, offline: bool = False, allow_moved_pr: bool = False,
            bisect: bool = False) -> ResolvedSources:
    """`bisect`: also a commit on the target branch or one the PR head no longer reaches (builder bisect)."""
    components = {}
    for name in COMPONENTS:
        with log.step(f"resolve {name}"):
            try:
                components[name] = resolve_component(settings, name, pins.components[name], pins.component_url(name),
                                                     offline, allow_moved_pr, bisect)
            except BadInput as exc:  # name the pins file too: `<pins>: components.<name>...`
                raise BadInput(f"{pins.path}: {exc}" if pins.path else str(exc)) from None
    return ResolvedSources(
        pins_path=str(pins.path), pins_sha256=pins.sha256,
        resolved_at=datetime.now(UTC).isoformat(timespec="seconds"), components=components)


def resolve_component(settings: Settings, name: str, pin: Component, url: str, offline: bool = False,
                      allow_moved_pr: bool = False, bisect: bool = False) -> ResolvedComponent:
    where = f"components.{name}"
    target_ref, pr_ref = f"refs/heads/{pin.target}", f"refs/pull/{pin.pr}/head"
    if offline and not mirror.mirror_path(settings, url).exists():
        raise BadInput(f"{where}.url: {url} is {mirror.OFFLINE_HINT}")
    repo, found = mirror.sync(settings, url, {target_ref: f"refs/remotes/origin/{pin.target}",
                                    pr_ref: f"refs/remotes/origin/pr/{pin.pr}"}, offline)
    if offline and None in found.values():
        missing = target_ref if found[target_ref] is None else pr_ref
        raise BadInput(f"{where}: {missing} of {url} is {mirror.OFFLINE_HINT}")
    if found[target_ref] is None:
        raise BadInput(f"{where}.target: branch {pin.target!r} not found at {url}")
    if found[pr_ref] is None:
        raise BadInput(f"{where}.pr: PR #{pin.pr} ({pr_ref}) not found at {url}")
    commit = _commit(repo, pin.commit)
    if commit is None:
        hint = f" ({mirror.OFFLINE_HINT})" if offline else ""
        raise BadInput(f"{where}.commit: commit {pin.commit} of {name} not found in the fetched refs of"
                       f" {mirror.looked_in(settings, url)}{hint}")
    pr_head, target_head = found[pr_ref], found[target_ref]
    assert pr_head is not None and target_head is not None
    moved = pr_head != commit.id
    if moved and bisect:  # still a commit of this repository, its tree exported and checked below
        log.info(f"{name}: bisect candidate {pin.commit[:12]} (PR #{pin.pr} head {str(pr_head)[:12]})")
    elif moved and not repo.descendant_of(pr_head, commit.id):
        raise BadInput(f"{where}.commit: commit {pin.commit} is not on PR #{pin.pr} (head {pr_head})")
    if moved and not bisect and (commit.id == target_head or repo.descendant_of(target_head, commit.id)):
        raise BadInput(f"{where}.commit: commit {pin.commit} is on {pin.target} (tip {str(target_head)[:12]}), not a"
                       f" commit of PR #{pin.pr}; --allow-moved-pr takes only the PR's commits, between merge-base"
                       f" {repo.merge_base(pr_head, target_head)} and head {pr_head}")
    if moved and not bisect:
        ahead = repo.ahead_behind(pr_head, commit.id)[0]
        log.info(f"{name}: PR #{pin.pr} head moved {ahead} commit(s) past the pinned {pin.commit[:12]}"
                 f" (now {str(pr_head)[:12]})")
        if not allow_moved_pr:
            raise BadInput(f"{where}.commit: PR #{pin.pr} head moved past {pin.commit} to {pr_head}"
                           " (update the pin, or pass --allow-moved-pr)")
    base = repo.merge_base(commit.id, target_head)
    if base is None:
        raise BadInput(f"{where}.commit: {pin.commit} shares no history with {pin.target} of {url}")
    ahead, behind = repo.ahead_behind(commit.id, target_head)
    version = scm_version(repo, str(commit.id), where)
    subs = submodules(settings, repo, commit, url, offline)
    stats = export_once(settings, repo, commit, subs)
    return ResolvedComponent(
        name=name, url=url, target=pin.target, pr=pin.pr, commit=str(commit.id), tree=str(commit.tree_id),
        commit_time=commit.committer.time, pr_head=str(pr_head), pr_moved=moved, merge_base=str(base),
        ahead=ahead, behind=behind, target_head=str(target_head), submodules=subs,
        export_sha256=stats.sha256, files=stats.files, version=version)


def scm_version(repo: pygit2.Repository, commit: str, where: str) -> str:
    """The VCS version of a component whose version comes from git, else ''. The tags it needs
    (those pointing into the commit's history) came with the fetch of the target and PR refs."""
    try:
        if scmversion.scm_settings(scmversion.pyproject_at(repo, commit)) is None:
            return ""
        return scmversion.component_version(repo, commit)
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None


def _commit(repo: pygit2.Repository, sha: str) -> pygit2.Commit | None:
    try:
        obj = repo.get(sha)
    except ValueError:
        return None
    return obj if isinstance(obj, pygit2.Commit) else None


def export_path(settings: Settings, export_sha256: str) -> Path:
    return settings.cache("exports") / f"{export_sha256}.tar"


def export_once(settings: Settings, repo: pygit2.Repository, commit: pygit2.Commit,
                subs: list[Submodule]) -> export.ExportStats:
    """Export the tree (submodules included) into the export cache, named by its sha256."""
    exports = settings.cache("exports")
    fs.sweep_parts(exports)  # what a killed run left
    part = fs.part_path(exports / "export.tar")  # named by its sha256 once written
    try:
        with open(part, "wb") as fh:
            stats = export.export_tar(repo, commit.id, fh, modules=modules_for(settings, subs))
        part.replace(export_path(settings, stats.sha256))
    finally:
        part.unlink(missing_ok=True)
    return stats


def submodules(settings: Settings, repo: pygit2.Repository, commit: pygit2.Commit, url: str, offline: bool,
               base: str = "", depth: int = 0) -> list[Submodule]:
    """Every gitlink below commit (recursively), each checked to exist in its own mirror."""
    links = list(_gitlinks(repo, commit.tree))
    if not links:
        return []
    if depth >= MAX_DEPTH:
        raise BadInput(f"{url}: submodules nested deeper than {MAX_DEPTH}")
    urls = gitmodules(repo, commit.tree)
    out = []
    for path, sha in links:
        full = base + path
        if path not in urls:
            raise BadInput(f"{url}: .gitmodules at {commit.id}: no entry for the submodule at {full!r}")
        sub_url = absolute_url(urls[path], url)
        sub_repo = mirror.ensure_commit(settings, sub_url, sha, offline)
        sub = _commit(sub_repo, sha)
        if sub is None:
            hint = mirror.OFFLINE_HINT if offline else "not found after fetching its branches, tags and the commit"
            raise BadInput(f"{full}: submodule commit {sha} of {sub_url}: {hint}")
        out.append(Submodule(path=full, url=sub_url, commit=sha, tree=str(sub.tree_id)))
        out += submodules(settings, sub_repo, sub, sub_url, offline, full + "/", depth + 1)
    return out


def _gitlinks(repo: pygit2.Repository, tree: pygit2.Tree, base: str = "") -> Iterator[tuple[str, str]]:
    for item in tree:
        if item.filemode == export.GITLINK:
            yield base + item.name, str(item.id)
        elif item.filemode == export.TREE:
            yield from _gitlinks(repo, repo[item.id], base + item.name + "/")


def gitmodules(repo: pygit2.Repository, tree: pygit2.Tree) -> dict[str, str]:
    """{path: url} from .gitmodules at tree (git-config syntax, read by libgit2)."""
    if ".gitmodules" not in tree:
        return {}
    data = repo[tree[".gitmodules"].id].data
    with tempfile.NamedTemporaryFile(suffix=".gitmodules") as fh:
        fh.write(data)
        fh.flush()
        entries = {e.name: e.value for e in pygit2.Config(fh.name)}
    out = {}
    for key, value in entries.items():
        section, _, field = key.rpartition(".")
        if key.startswith("submodule.") and field == "path" and f"{section}.url" in entries:
            out[value.strip("/")] = entries[f"{section}.url"]
    return out


def absolute_url(sub_url: str, parent_url: str) -> str:
    """A .gitmodules URL made absolute: ./x and ../x are relative to the superproject's URL."""
    if not sub_url.startswith(("./", "../")):
        return sub_url
    scheme, sep, rest = parent_url.rstrip("/").partition("://")
    if not sep:
        scheme, rest = "", parent_url.rstrip("/")
    joined = posixpath.normpath(posixpath.join(rest, sub_url))
    return f"{scheme}://{joined}" if scheme else joined


def modules_for(settings: Settings, subs: list[Submodule]) -> export.Modules:
    """The modules(path, sha) callback export_tar needs, from resolved submodules (no fetch)."""
    urls = {s.path: s.url for s in subs}

    def lookup(path: str, sha: str) -> pygit2.Repository:
        if path not in urls:
            raise BadInput(f"{path}: submodule not in the resolved sources")
        return mirror.open_mirror(settings, urls[path])

    return lookup


def exported_tar(settings: Settings, component: ResolvedComponent) -> Path:
    """The export resolve made of this component (made again from the mirrors if this cache lacks it)."""
    path = export_path(settings, component.export_sha256)
    if not path.is_file():
        repo = mirror.open_mirror(settings, component.url)
        stats = export_once(settings, repo, repo[component.commit].peel(pygit2.Commit), component.submodules)
        if stats.sha256 != component.export_sha256:
            raise BadInput(f"components.{component.name}: export of {component.commit} has sha256 {stats.sha256},"
                           f" resolved {component.export_sha256}")
    return path


def format_table(resolved: ResolvedSources) -> str:
    head = ("component", "PR", "target", "merge-base", "head", "ahead/behind", "tree", "files", "moved")
    rows = [head] + [
        (c.name, f"#{c.pr}", c.target, c.merge_base[:12], c.commit[:12], f"+{c.ahead}/-{c.behind}",
         c.tree[:12], str(c.files), "yes" if c.pr_moved else "")
        for c in resolved.components.values()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    for c in resolved.components.values():
        for s in c.submodules:
            lines.append(f"  {c.name}: submodule {s.path} @ {s.commit[:12]} ({s.url})")
    return "\n".join(lines)
