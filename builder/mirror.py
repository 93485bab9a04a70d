"""Persistent bare mirrors of remote repositories, one per URL, shared safely between runs.

Each mirror lives under cache_dir('mirrors') as <sanitised-url>-<hash>.git with a lock file next
to it; init and fetch happen under an exclusive flock so two runs never write at once. Objects
are never removed, so reading objects after the lock is released is safe.
"""
import hashlib
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pygit2

from builder import host
from builder.errors import BadInput, InfraError
from builder.options import Settings

OFFLINE_HINT = "not in the mirror cache; run without --offline"


def mirror_path(settings: Settings, url: str) -> Path:
    """The mirror directory of a URL: readable name plus a short hash of the exact URL."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", url).strip("_.")[-60:] or "repo"
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return settings.cache("mirrors") / f"{name}-{digest}.git"


@contextmanager
def locked(path: Path, exclusive: bool = True) -> Iterator[None]:
    """The mirror's lock file sits beside it (the mirror directory may not exist yet)."""
    with host.locked(path.with_name(path.name + ".lock"), exclusive):
        yield


def _open_or_init(path: Path) -> pygit2.Repository:
    if path.exists():
        try:
            return pygit2.Repository(str(path))
        except pygit2.GitError:
            shutil.rmtree(path)  # a run died during init; start again
    return pygit2.init_repository(str(path), bare=True)


def open_mirror(settings: Settings, url: str) -> pygit2.Repository:
    """The existing mirror of a URL, without fetching."""
    path = mirror_path(settings, url)
    if not path.exists():
        raise BadInput(f"{url}: {OFFLINE_HINT}")
    with locked(path, exclusive=False):
        return pygit2.Repository(str(path))


def sync(settings: Settings, url: str, refs: dict[str, str],
         offline: bool = False) -> tuple[pygit2.Repository, dict[str, pygit2.Oid | None]]:
    """Fetch remote refs into the mirror of url and return (repo, {remote ref: Oid or None}).

    refs maps a remote ref (refs/heads/main, refs/pull/7/head) to the mirror ref it is stored
    under (refs/remotes/origin/main, refs/remotes/origin/pr/7). A ref the remote does not have
    comes back as None (and a stale local copy is deleted). Offline, nothing is fetched and the
    values are whatever the mirror holds.
    """
    path = mirror_path(settings, url)
    if offline and not path.exists():
        raise BadInput(f"{url}: {OFFLINE_HINT}")
    with locked(path):
        repo = pygit2.Repository(str(path)) if offline else _open_or_init(path)
        if not offline:
            advertised = _fetch(repo, url, refs)
            for remote_ref, local_ref in refs.items():
                if remote_ref not in advertised and local_ref in repo.references:
                    repo.references.delete(local_ref)
        found: dict[str, pygit2.Oid | None] = {}
        for remote_ref, local_ref in refs.items():
            ref = repo.references.get(local_ref)
            found[remote_ref] = ref.resolve().target if ref else None
    return repo, found


def _fetch(repo: pygit2.Repository, url: str, refs: dict[str, str]) -> set[str]:
    """Fetch with explicit refspecs; return the set of ref names the remote advertised."""
    remote = repo.remotes.create_anonymous(url)
    refspecs = [f"+{src}:{dst}" for src, dst in refs.items()]
    try:
        remote.fetch(refspecs, message=f"builder fetch {url}")
        return {head.name for head in remote.list_heads(connect=False)}
    except pygit2.GitError as exc:
        raise InfraError(f"{url}: fetch failed: {exc}") from None


def ensure_commit(settings: Settings, url: str, sha: str, offline: bool = False) -> pygit2.Repository:
    """The mirror of url holding commit sha (a submodule's gitlink), fetching branches and tags
    first and then the commit itself (servers that allow it); None of that offline."""
    path = mirror_path(settings, url)
    if offline and not path.exists():
        raise BadInput(f"{url}: {OFFLINE_HINT}")
    with locked(path):
        repo = pygit2.Repository(str(path)) if offline else _open_or_init(path)
        if sha in repo or offline:
            return repo
        remote = repo.remotes.create_anonymous(url)
        try:
            remote.fetch(["+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"])
        except pygit2.GitError as exc:
            raise InfraError(f"{url}: fetch failed: {exc}") from None
        if sha not in repo:
            try:
                remote.fetch([f"+{sha}:refs/keep/{sha}"])
            except pygit2.GitError:
                pass  # the server refuses fetching by id; reported by the caller
    return repo
