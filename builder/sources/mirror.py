"""Persistent bare mirrors of remote repositories, one per URL, shared safely between runs.

Fetches run the git CLI (builder/sources/gitcli.py): for a local repository it is 3-10x faster than
libgit2, which builds a fresh pack of every object in-process. pygit2 reads the mirror.

Each mirror lives under cache_dir('mirrors') as <sanitised-url>-<hash>.git (of the normalised URL:
`/abs` and `file:///abs` share one) with a lock file next
to it; init and fetch happen under an exclusive flock so two runs never write at once. Objects
are never removed, so reading objects after the lock is released is safe.
"""
import hashlib
import posixpath
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import pygit2

from builder.core import files as fs
from builder.core.errors import BadInput, InfraError
from builder.core.options import Settings
from builder.sources import gitcli

OFFLINE_HINT = "not in the mirror cache; run without --offline"


def normalised_url(url: str) -> str:
    """One spelling per repository: `file:///abs` and `file://localhost/abs` are `/abs`, a local path is
    normalised (`/a/./b/` is `/a/b`), a remote URL's scheme and host are lower-case, trailing slashes go."""
    parts = urlsplit(url)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        url = unquote(parts.path)
    elif parts.scheme and parts.netloc:
        user, at, host = parts.netloc.rpartition("@")
        return urlunsplit((parts.scheme.lower(), user + at + host.lower(), parts.path.rstrip("/") or "/",
                           parts.query, parts.fragment))
    if url.startswith("/"):
        return posixpath.normpath(url)
    return url.rstrip("/") or url


def mirror_path(settings: Settings, url: str) -> Path:
    """The mirror directory of a URL: readable name plus a short hash of the normalised URL."""
    key = normalised_url(url)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_.")[-60:] or "repo"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return settings.cache_root / "mirrors" / f"{name}-{digest}.git"  # created only when fetching (not --offline)


@contextmanager
def locked(path: Path, exclusive: bool = True) -> Iterator[None]:
    """The mirror's lock file sits beside it (the mirror directory may not exist yet)."""
    with fs.locked(path.with_name(path.name + ".lock"), exclusive):
        yield


def clear_stale(path: Path) -> list[Path]:
    """Under the mirror's exclusive lock no git runs in it, so any git lock file (`*.lock`) or temporary
    pack (`objects/pack/tmp_*`, `objects/incoming-*`) is what a killed fetch left: removed, or the next fetch
    would refuse ("Unable to create ... .lock: File exists")."""
    removed: list[Path] = []
    if not path.is_dir():
        return removed
    stale = [*path.glob("*.lock"), *path.glob("refs/**/*.lock"), *path.glob("objects/pack/tmp_*"),
             *path.glob("objects/incoming-*")]
    for item in stale:
        if item.is_dir():
            shutil.rmtree(item, ignore_errors=True)
        else:
            item.unlink(missing_ok=True)
        removed.append(item)
    return removed


def _open_or_init(path: Path) -> pygit2.Repository:
    clear_stale(path)
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
    under (refs/remotes/origin/main, refs/remotes/origin/pr/7). Only those refs are fetched (plus
    the tags that point into their history: a VCS version needs the nearest one). A ref the remote
    does not have comes back as None (and a stale local copy is deleted). Offline, nothing is
    fetched and the values are whatever the mirror holds.
    """
    path = mirror_path(settings, url)
    if offline and not path.exists():
        raise BadInput(f"{url}: {OFFLINE_HINT}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path):
        repo = pygit2.Repository(str(path)) if offline else _open_or_init(path)
        if not offline:
            advertised = gitcli.ls_remote(settings, url, list(refs))
            wanted = {src: dst for src, dst in refs.items() if src in advertised}
            if wanted:
                gitcli.fetch(settings, path, url, [f"+{src}:{dst}" for src, dst in wanted.items()])
            repo = pygit2.Repository(str(path))  # sees the packs git just wrote
            for remote_ref, local_ref in refs.items():
                if remote_ref not in advertised and local_ref in repo.references:
                    repo.references.delete(local_ref)
        found: dict[str, pygit2.Oid | None] = {}
        for remote_ref, local_ref in refs.items():
            ref = repo.references.get(local_ref)
            target = ref.resolve().target if ref else None
            found[remote_ref] = target if isinstance(target, pygit2.Oid) else None
    return repo, found


def looked_in(settings: Settings, url: str) -> str:
    """`url`, and where a fetch of it really went when url.<base>.insteadOf (BUILDER_GIT_CONFIG) rewrites it:
    a message about a missing commit or ref names both."""
    try:
        actual = gitcli.effective_url(settings, url)
    except InfraError:
        return url
    if actual == url:
        return url
    return f"{url} (fetched from {actual}, url.insteadOf in BUILDER_GIT_CONFIG)"


def ensure_commit(settings: Settings, url: str, sha: str, offline: bool = False) -> pygit2.Repository:
    """The mirror of url holding commit sha (a submodule's gitlink): the commit itself is fetched
    first (servers that allow it), then branches and tags; None of that offline."""
    path = mirror_path(settings, url)
    if offline and not path.exists():
        raise BadInput(f"{url}: {OFFLINE_HINT}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path):
        repo = pygit2.Repository(str(path)) if offline else _open_or_init(path)
        if sha in repo or offline:
            return repo
        try:
            gitcli.fetch(settings, path, url, [f"+{sha}:refs/keep/{sha}"])
        except InfraError:
            pass  # the server refuses fetching by id (or an unreachable one); try its refs
        repo = pygit2.Repository(str(path))
        if sha not in repo:
            gitcli.fetch(settings, path, url, ["+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"])
            repo = pygit2.Repository(str(path))
    return repo
