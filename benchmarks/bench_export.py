"""Resolve + export of a real repository against `git archive` of the same commit (prints figures).

usage: python benchmarks/bench_export.py REPO_GIT_DIR [--pr N] [--target main] [--runs 9] [--seed]

REPO_GIT_DIR is a (bare) clone that has refs/pull/<N>/head, e.g. a fetched GitHub snapshot. The
mirror cache goes to a fresh temporary directory, so the first resolve is a cold fetch. --seed
instead pre-seeds the mirror (objects/info/alternates + the two refs) for snapshots that lack some
historical blobs: libgit2 reads every object it packs, so a cold fetch of such a snapshot fails.
"""
import argparse
import hashlib
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from builder.pins.model import Component

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def best_of(runs: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def cpu_seconds() -> float:
    """CPU time of this process plus its waited-for children (git archive runs as a child)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def interleaved(runs: int, fns: dict[str, Callable[[], object]]) -> dict[str, tuple[float, float]]:
    """Run the functions in turn, runs times (so load from other processes hits both alike);
    return {name: (best wall s, best cpu s)}."""
    walls: dict[str, list[float]] = {k: [] for k in fns}
    cpus: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), cpu_seconds()
            fn()
            walls[name].append(time.perf_counter() - wall)
            cpus[name].append(cpu_seconds() - cpu)
    return {k: (min(walls[k]), min(cpus[k])) for k in fns}


def members(path: Path) -> dict[str, Any]:
    """{name: (kind, mode, sha256 of content or link target)} of files, links and dirs."""
    out = {}
    with tarfile.open(path) as tar:
        for m in tar:
            if m.isfile():
                member = tar.extractfile(m)
                assert member is not None  # a regular file
                out[m.name] = ("file", m.mode, hashlib.sha256(member.read()).hexdigest())
            elif m.issym():
                out[m.name] = ("link", 0, m.linkname)
            elif m.isdir():
                out[m.name.rstrip("/")] = ("dir", m.mode, "")
    return out


def seed(path: Path, source: str, refs: dict[str, Any]) -> None:
    import pygit2

    repo = pygit2.init_repository(str(path), bare=True)
    (path / "objects" / "info" / "alternates").write_text(f"{source}/objects\n")
    src = pygit2.Repository(source)
    for remote_ref, local_ref in refs.items():
        repo.references.create(local_ref, src.references[remote_ref].resolve().target, force=True)


def latest_pr(repo_dir: str) -> int:
    refs = subprocess.run(["git", "-C", repo_dir, "for-each-ref", "--format=%(refname)", "refs/pull/"],
                          check=True, capture_output=True, text=True).stdout.split()
    return max(int(r.split("/")[2]) for r in refs if r.endswith("/head"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--pr", type=int)
    ap.add_argument("--target", default="main")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--seed", action="store_true")
    args = ap.parse_args()
    repo_dir = str(Path(args.repo).resolve())
    pr = args.pr or latest_pr(repo_dir)
    head = subprocess.run(["git", "-C", repo_dir, "rev-parse", f"refs/pull/{pr}/head"],
                          check=True, capture_output=True, text=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    os.environ["BUILDER_CACHE"] = str(work / "cache")
    from builder.core.options import Settings
    from builder.sources import mirror
    from builder.sources import resolve as sources
    from builder.sources import treetar as export

    settings = Settings.from_env()

    pin = cast("Component", SimpleNamespace(target=args.target, pr=pr, commit=head))  # the fields it reads
    if args.seed:
        seed(mirror.mirror_path(settings, repo_dir), repo_dir, {f"refs/heads/{args.target}": f"refs/remotes/origin/{args.target}",
                                                      f"refs/pull/{pr}/head": f"refs/remotes/origin/pr/{pr}"})
    start = time.perf_counter()
    comp = sources.resolve_component(settings, "megatron", pin, repo_dir)
    cold = time.perf_counter() - start
    warm = best_of(1, lambda: sources.resolve_component(settings, "megatron", pin, repo_dir))
    offline = best_of(1, lambda: sources.resolve_component(settings, "megatron", pin, repo_dir, offline=True))
    mirror_repo = mirror.open_mirror(settings, repo_dir)

    ours, theirs = work / "ours.tar", work / "git-archive.tar"

    def run_ours() -> None:
        with open(ours, "wb") as fh:
            export.export_tar(mirror_repo, head, fh)

    def run_git() -> None:
        with open(theirs, "wb") as fh:
            subprocess.run(["git", "-C", str(mirror_repo.path), "-c", "tar.umask=0022", "archive", head],
                           stdout=fh, check=True)

    timed = interleaved(args.runs, {"git": run_git, "ours": run_ours})
    (t_git, c_git), (t_ours, c_ours) = timed["git"], timed["ours"]
    t_manifest = best_of(args.runs, lambda: export.file_manifest(mirror_repo, head))
    a, b = members(ours), members(theirs)
    files = sum(1 for v in a.values() if v[0] != "dir")
    print(f"repository       {repo_dir}")
    print(f"PR               #{pr} head {head[:12]} target {args.target}")
    print(f"merge-base       {comp.merge_base[:12]}  ahead/behind +{comp.ahead}/-{comp.behind}  tree {comp.tree[:12]}")
    print(f"files            {files} (resolve says {comp.files}), tar {ours.stat().st_size / 1e6:.1f} MB")
    first = "seeded mirror, fetch finds nothing new" if args.seed else "fetch into an empty mirror"
    print(f"resolve first    {cold:.2f} s ({first} + checks + export hash)")
    print(f"resolve warm     {warm:.2f} s (fetch, nothing new)  offline {offline:.2f} s")
    print(f"git archive      {t_git:.3f} s wall, {c_git:.3f} s cpu (best of {args.runs}, interleaved)")
    print(f"export_tar       {t_ours:.3f} s wall, {c_ours:.3f} s cpu (same runs; includes its sha256)")
    print(f"ratio            {t_ours / t_git:.2f}x git archive wall, {c_ours / c_git:.2f}x cpu")
    print(f"file_manifest    {t_manifest:.3f} s")
    print(f"same members     {a == b} ({len(a)} entries: files, links, dirs; names, modes, contents)")
    print(f"export sha256    {hashlib.sha256(ours.read_bytes()).hexdigest()} (resolve: {comp.export_sha256})")
    if a != b:
        diff = sorted(set(a) ^ set(b))[:5] or [k for k in a if a[k] != b.get(k)][:5]
        print(f"first differences: {diff}")


if __name__ == "__main__":
    main()
