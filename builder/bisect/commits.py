"""The commit range of one component: GOOD's commit to BAD's along first parents, oldest first (BAD's last).

After a force-push GOOD's commit is no ancestor of BAD's: the range is then BAD's PR commits since its merge-base
with the target branch, the merge-base first (it is not assumed good: the search builds it like any other)."""
from __future__ import annotations

from dataclasses import dataclass

import pygit2

from builder.core.errors import BadInput

MAX_RANGE = 4096  # commits walked along first parents before giving up


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    author: str


@dataclass(frozen=True)
class Range:
    component: str
    commits: list[Commit]     # oldest first; the last is BAD's
    note: str                 # "" or why the range is not GOOD..BAD


def info(repo: pygit2.Repository, sha: str) -> Commit:
    commit = repo[sha].peel(pygit2.Commit)
    return Commit(sha, commit.message.splitlines()[0] if commit.message else "",
                  f"{commit.author.name} <{commit.author.email}>")


def first_parents(repo: pygit2.Repository, bad: str, stop: set[str]) -> list[str] | None:
    """bad's first-parent chain back to (not including) a commit in `stop`, oldest first; None if none is met."""
    chain: list[str] = []
    sha = bad
    for _ in range(MAX_RANGE):
        if sha in stop:
            return chain[::-1]
        chain.append(sha)
        commit = repo[sha].peel(pygit2.Commit)
        if not commit.parent_ids:
            return None
        sha = str(commit.parent_ids[0])
    return None


def commit_range(repo: pygit2.Repository, component: str, good: str, bad: str, target_head: str) -> Range:
    """The range of `component` from GOOD's commit to BAD's (BadInput when BAD's commit is not in the mirror)."""
    if _missing(repo, bad):
        raise BadInput(f"BAD: components.{component}.commit {bad} is not in the mirror of its repository")
    if not _missing(repo, good):
        chain = first_parents(repo, bad, {good})
        if chain is not None:
            return Range(component, [info(repo, s) for s in chain], "")
    base = repo.merge_base(pygit2.Oid(hex=bad), pygit2.Oid(hex=target_head))
    if base is None:
        raise BadInput(f"BAD: components.{component}.commit {bad} shares no history with its target branch")
    chain = first_parents(repo, bad, {str(base)}) or []
    return Range(component, [info(repo, s) for s in [str(base), *chain]],
                 f"GOOD's {component} commit {good[:12]} is not an ancestor of BAD's (a force-push?): the range is "
                 f"BAD's PR commits since their merge-base {str(base)[:12]} with the target")


def _missing(repo: pygit2.Repository, sha: str) -> bool:
    try:
        return not isinstance(repo.get(sha), pygit2.Commit)
    except ValueError:
        return True
