"""Cold resolve of a large repository against `git clone --mirror` of the same refs (prints figures).

usage: python benchmarks/bench_resolve.py REPO_GIT_DIR --pr N [--target main] [--runs 3] [--libgit2]
                                          [--git-config FILE]

REPO_GIT_DIR is a (bare) clone with refs/pull/<N>/head, e.g. a fetched GitHub snapshot. Each run:
- git: an empty bare repository fetching exactly +<target> and +refs/pull/<N>/head (what
  `git clone --mirror` does for a remote holding only those refs; a local clone would hard-link);
- resolve: builder's resolve_component into a fresh empty mirror cache (fetch, PR/merge-base checks,
  submodules, export hash).
Runs are interleaved so load from other processes hits both alike; best of --runs is reported.
--git-config names a git config file (as BUILDER_GIT_CONFIG) whose url.<base>.insteadOf rules point
submodules (verl's recipe) at local mirrors; their fetch counts in the resolve time only.
--libgit2 also times the former libgit2 fetch of the same refspecs once (for comparison).
"""
from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Callable

    from builder.core.records import ResolvedComponent
    from builder.pins.model import Component

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def git_mirror(src: str, refspecs: list[str], dest: Path) -> None:
    subprocess.run(["git", "init", "-q", "--bare", str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "fetch", "-q", src, *refspecs], check=True)


def libgit2_fetch(src: str, refspecs: list[str], dest: Path) -> str:
    """The former fetch (pygit2), timed; or why it failed."""
    import pygit2

    repo = pygit2.init_repository(str(dest), bare=True)
    start = time.perf_counter()
    try:
        repo.remotes.create_anonymous(src).fetch(refspecs)
    except pygit2.GitError as exc:  # it packs every object of every ref: a snapshot missing one fails
        return f"failed after {time.perf_counter() - start:.2f} s: {exc}"
    return f"{time.perf_counter() - start:.2f} s"


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--pr", type=int, required=True)
    ap.add_argument("--target", default="main")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--libgit2", action="store_true")
    ap.add_argument("--git-config", type=Path)
    args = ap.parse_args()
    if args.git_config and not args.git_config.is_file():
        ap.error(f"--git-config: no such file {args.git_config}")
    src = str(Path(args.repo).resolve())
    head = subprocess.run(["git", "-C", src, "rev-parse", f"refs/pull/{args.pr}/head"],
                          check=True, capture_output=True, text=True).stdout.strip()
    refspecs = [f"+refs/heads/{args.target}:refs/remotes/origin/{args.target}",
                f"+refs/pull/{args.pr}/head:refs/remotes/origin/pr/{args.pr}"]
    work = Path(tempfile.mkdtemp(prefix="bench-resolve-"))
    from builder.core.options import Settings
    from builder.sources import mirror
    from builder.sources import resolve as sources

    if args.git_config:
        os.environ["BUILDER_GIT_CONFIG"] = str(args.git_config.resolve())

    pin = cast("Component", SimpleNamespace(target=args.target, pr=args.pr, commit=head))  # the fields it reads
    git_times: list[float] = []
    resolve_times: list[float] = []
    comp: ResolvedComponent | None = None
    try:
        for i in range(args.runs):
            git_times.append(timed(functools.partial(git_mirror, src, refspecs, work / f"git-{i}.git")))
            os.environ["BUILDER_CACHE"] = str(work / f"cache-{i}")
            settings = Settings.from_env()
            start = time.perf_counter()
            comp = sources.resolve_component(settings, "megatron", pin, src)
            resolve_times.append(time.perf_counter() - start)
            print(f"run {i + 1}: git {git_times[-1]:.2f} s, resolve {resolve_times[-1]:.2f} s", flush=True)
        old = libgit2_fetch(src, refspecs, work / "libgit2.git") if args.libgit2 else None
        refs = subprocess.run(["git", "-C", src, "for-each-ref", "--format=x"], check=True,
                              capture_output=True, text=True).stdout.count("x")
        t_git, t_res = min(git_times), min(resolve_times)
        assert comp is not None  # args.runs >= 1
        print(f"repository       {src} ({refs} refs, {size_mb(Path(src)):.0f} MB)")
        print(f"refs             {args.target} + refs/pull/{args.pr}/head (head {head[:12]})")
        subs = ", ".join(f"{m.path} ({m.url})" for m in comp.submodules) or "none"
        print(f"submodules       {subs}")
        print(f"resolved         merge-base {comp.merge_base[:12]} +{comp.ahead}/-{comp.behind}, {comp.files} files")
        print(f"git fetch        {t_git:.2f} s (empty bare repo, same refspecs; best of {args.runs})")
        print(f"builder resolve  {t_res:.2f} s (empty mirror cache; fetch + checks + export hash)")
        print(f"ratio            {t_res / t_git:.2f}x (target <= 2x)")
        mirror_dir = mirror.mirror_path(settings, src)
        print(f"mirror size      {size_mb(mirror_dir):.0f} MB vs git {size_mb(work / 'git-0.git'):.0f} MB")
        if old is not None:
            print(f"libgit2 fetch    {old} (the former fetch, same refspecs, once)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
