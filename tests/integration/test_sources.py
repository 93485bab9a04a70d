"""resolve() against real git repositories built here: a bare "upstream" with refs/pull/N/head."""
import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from builder.core.constants import COMPONENTS
from builder.core.errors import BadInput, InfraError
from builder.core.options import Settings
from builder.pins.model import Component, Pins
from builder.sources import mirror
from builder.sources import resolve as sources

SETTINGS = Settings.from_env()

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}


def git(cwd: str | Path, *args: str, date: str = "2024-01-01T00:00:00Z") -> str:
    env = {**os.environ, **ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    out = subprocess.run(["git", "-c", "protocol.file.allow=always", "-c", "init.defaultBranch=main", *args],
                         cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def commit(work: str | Path, name: str, text: str = "x") -> str:
    (Path(work) / name).write_text(text)
    git(work, "add", name)
    git(work, "commit", "-qm", name)
    return git(work, "rev-parse", "HEAD")


def use_cache(monkeypatch: pytest.MonkeyPatch, path: str | Path) -> None:
    """Point BUILDER_CACHE somewhere else and re-read the settings, as a new command would."""
    monkeypatch.setenv("BUILDER_CACHE", str(path))
    monkeypatch.setattr(sys.modules[__name__], "SETTINGS", Settings.from_env())


def reread_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read the settings again after changing the environment, as a new command would."""
    monkeypatch.setattr(sys.modules[__name__], "SETTINGS", Settings.from_env())


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    use_cache(monkeypatch, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def upstream(tmp_path: Path) -> SimpleNamespace:
    """main: A-B-C; PR #7 branches at B: P1-P2 (head P2); extra P3 on top of P2 (not pushed yet);
    X on an unrelated branch from A."""
    work, bare = tmp_path / "work", tmp_path / "upstream.git"
    git(tmp_path, "init", "-q", str(work))
    a = commit(work, "a")
    b = commit(work, "b")
    git(work, "checkout", "-qb", "pr")
    p1 = commit(work, "p1")
    p2 = commit(work, "p2")
    p3 = commit(work, "p3")
    git(work, "checkout", "-q", "main")
    c = commit(work, "c")
    git(work, "checkout", "-qb", "other", a)
    x = commit(work, "x")
    git(tmp_path, "init", "-q", "--bare", str(bare))
    git(work, "push", "-q", str(bare), "main:refs/heads/main", f"{p2}:refs/pull/7/head", "other:refs/heads/other")
    return SimpleNamespace(work=work, bare=bare, url=str(bare), a=a, b=b, c=c, p1=p1, p2=p2, p3=p3, x=x)


def pin(commit: str, pr: int = 7, target: str = "main") -> Component:
    """Stand-in with the attributes resolve_component() reads from a pinned component."""
    return cast(Component, SimpleNamespace(url="", target=target, pr=pr, commit=commit))


def pins_for(url: str, commit: str, tmp_path: Path, pr: int = 7) -> Pins:
    """Stand-in with the attributes resolve() reads from builder.pins.model.Pins."""
    comps = {n: pin(commit, pr) for n in COMPONENTS}
    return cast(Pins, SimpleNamespace(components=comps, component_url=lambda name: url, path=tmp_path / "pins.yaml",
                                      sha256="0" * 64))


def test_happy_path_records_merge_base_and_counts(upstream: SimpleNamespace, tmp_path: Path) -> None:
    resolved = sources.resolve(pins_for(upstream.url, upstream.p2, tmp_path), SETTINGS)
    comp = resolved.components["verl"]
    assert list(resolved.components) == ["vllm", "megatron", "verl"]
    assert comp.commit == comp.pr_head == upstream.p2 and comp.pr_moved is False
    assert comp.merge_base == upstream.b
    assert (comp.ahead, comp.behind) == (2, 1)
    assert comp.target_head == upstream.c
    assert comp.tree == git(upstream.work, "rev-parse", f"{upstream.p2}^{{tree}}")
    assert comp.commit_time == 1704067200
    assert comp.files == 4 and len(comp.export_sha256) == 64  # a, b, p1, p2
    assert comp.submodules == []
    data = json.loads(resolved.model_dump_json(indent=2))
    assert data["components"]["vllm"]["merge_base"] == upstream.b
    table = sources.format_table(resolved)
    assert "merge-base" in table and upstream.b[:12] in table and "+2/-1" in table


def test_file_url_works(upstream: SimpleNamespace) -> None:
    comp = sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), f"file://{upstream.bare}")
    assert comp.merge_base == upstream.b


def test_missing_commit_fails(upstream: SimpleNamespace) -> None:
    with pytest.raises(BadInput, match=r"components.vllm.commit: commit 1{40} of vllm not found"):
        sources.resolve_component(SETTINGS, "vllm", pin("1" * 40), upstream.url)


def test_missing_pr_ref_fails(upstream: SimpleNamespace) -> None:
    with pytest.raises(BadInput, match=r"PR #99 \(refs/pull/99/head\) not found"):
        sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2, pr=99), upstream.url)


def test_missing_target_branch_fails(upstream: SimpleNamespace) -> None:
    with pytest.raises(BadInput, match="branch 'develop' not found"):
        sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2, target="develop"), upstream.url)


def test_moved_pr_head_fails_unless_allowed(upstream: SimpleNamespace) -> None:
    git(upstream.work, "push", "-qf", str(upstream.bare), f"{upstream.p3}:refs/pull/7/head")
    with pytest.raises(BadInput, match=f"PR #7 head moved past {upstream.p2} to {upstream.p3}"):
        sources.resolve_component(SETTINGS, "megatron", pin(upstream.p2), upstream.url)
    comp = sources.resolve_component(SETTINGS, "megatron", pin(upstream.p2), upstream.url, allow_moved_pr=True)
    assert comp.pr_moved is True and comp.pr_head == upstream.p3 and comp.commit == upstream.p2


def test_allow_moved_pr_accepts_an_older_commit_of_the_pr(upstream: SimpleNamespace) -> None:
    git(upstream.work, "push", "-qf", str(upstream.bare), f"{upstream.p3}:refs/pull/7/head")
    comp = sources.resolve_component(SETTINGS, "vllm", pin(upstream.p1), upstream.url, allow_moved_pr=True)
    assert comp.commit == upstream.p1 and comp.pr_moved and comp.merge_base == upstream.b


def test_allow_moved_pr_refuses_the_merge_base_and_the_root(upstream: SimpleNamespace) -> None:
    git(upstream.work, "push", "-qf", str(upstream.bare), f"{upstream.p3}:refs/pull/7/head")
    for sha in (upstream.b, upstream.a):  # ancestors of the PR head, but on main: not commits of the PR
        with pytest.raises(BadInput, match=f"commit {sha} is on main.*not a commit of PR #7.*"
                                           f"between merge-base {upstream.b} and head {upstream.p3}") as err:
            sources.resolve_component(SETTINGS, "vllm", pin(sha), upstream.url, allow_moved_pr=True)
        assert err.value.exit_code == 2


def test_commit_not_on_pr_fails_even_when_allowed(upstream: SimpleNamespace) -> None:
    with pytest.raises(BadInput, match=f"commit {upstream.c} is not on PR #7"):  # on main, not under the head
        sources.resolve_component(SETTINGS, "verl", pin(upstream.c), upstream.url, allow_moved_pr=True)
    with pytest.raises(BadInput, match=f"commit {upstream.x} of verl not found in the fetched refs"):
        sources.resolve_component(SETTINGS, "verl", pin(upstream.x), upstream.url, allow_moved_pr=True)  # another branch


def test_deleted_pr_ref_is_not_served_from_a_stale_mirror(upstream: SimpleNamespace) -> None:
    sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), upstream.url)
    git(upstream.bare, "update-ref", "-d", "refs/pull/7/head")
    with pytest.raises(BadInput, match="PR #7"):
        sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), upstream.url)


def test_offline_uses_warm_cache_and_fetches_nothing(upstream: SimpleNamespace, tmp_path: Path, cache: Path) -> None:
    warm = sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), upstream.url)
    upstream.bare.rename(tmp_path / "gone.git")  # any fetch would now fail
    with pytest.raises(BadInput, match=f"{upstream.url}: no such local repository"):
        sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), upstream.url)
    offline = sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), upstream.url, offline=True)
    assert offline == warm


def test_offline_cold_cache_fails_clearly(upstream: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_cache(monkeypatch, str(tmp_path / "cold"))
    with pytest.raises(BadInput, match="not in the mirror cache; run without --offline"):
        sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), upstream.url, offline=True)


def test_offline_missing_pr_in_warm_cache_fails_clearly(upstream: SimpleNamespace) -> None:
    sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), upstream.url)
    with pytest.raises(BadInput, match="refs/pull/8/head .* not in the mirror cache; run without --offline"):
        sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2, pr=8), upstream.url, offline=True)


@pytest.mark.parametrize("url", ["/no/such/repo.git", "file:///no/such/repo.git"])
def test_missing_local_path_is_bad_input(url: str) -> None:
    with pytest.raises(BadInput, match=f"{url}: no such local repository /no/such/repo.git") as err:
        sources.resolve_component(SETTINGS, "vllm", pin("1" * 40), url)
    assert err.value.exit_code == 2


def test_local_path_that_is_not_a_repository_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(BadInput, match="plain is not a git repository"):
        sources.resolve_component(SETTINGS, "vllm", pin("1" * 40), str(tmp_path / "plain"))


def test_unreachable_remote_is_infra_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_SSH_COMMAND", "false")  # the transport fails, as an unreachable host would
    reread_settings(monkeypatch)
    with pytest.raises(InfraError, match="ssh://git@example.invalid/x.git: fetch failed") as err:
        sources.resolve_component(SETTINGS, "vllm", pin("1" * 40), "ssh://git@example.invalid/x.git")
    assert err.value.exit_code == 3


def test_only_the_target_and_pr_refs_are_fetched(upstream: SimpleNamespace) -> None:
    sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), upstream.url)
    refs = git(mirror.mirror_path(SETTINGS, upstream.url), "for-each-ref", "--format=%(refname)").split()
    assert refs == ["refs/remotes/origin/main", "refs/remotes/origin/pr/7"]
    assert upstream.x not in git(mirror.mirror_path(SETTINGS, upstream.url), "rev-list", "--all", "--objects")


@pytest.mark.slow  # two interpreters resolving at once
def test_two_processes_share_a_cold_cache(upstream: SimpleNamespace, cache: Path) -> None:
    code = ("import sys; from types import SimpleNamespace as N; from builder.sources import resolve as sources;"
            "from builder.core.options import Settings;"
            "c = sources.resolve_component(Settings.from_env(), 'vllm', N(target='main', pr=7, commit=sys.argv[2]),"
            " sys.argv[1]);"
            "print(c.export_sha256)")
    env = {**os.environ, "BUILDER_CACHE": str(cache), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", code, upstream.url, upstream.p2], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0] and len(outs[0][0].strip()) == 64


def test_fetch_waits_for_the_mirror_lock(upstream: SimpleNamespace) -> None:
    path = mirror.mirror_path(SETTINGS, upstream.url)
    path.parent.mkdir(parents=True, exist_ok=True)  # mirror_path creates nothing (offline lookups)
    done = threading.Event()
    with open(path.with_name(path.name + ".lock"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        def resolve() -> None:
            sources.resolve_component(SETTINGS, "vllm", pin(upstream.p2), upstream.url)
            done.set()

        worker = threading.Thread(target=resolve)
        worker.start()
        assert not done.wait(0.5)  # blocked while another run holds the lock
        fcntl.flock(fh, fcntl.LOCK_UN)
    worker.join(30)
    assert done.is_set()


def test_mirror_dir_name_is_readable_and_unique(cache: Path) -> None:
    one, two = mirror.mirror_path(SETTINGS, "https://github.com/a/b.git"), mirror.mirror_path(SETTINGS, "https://github.com/a/b")
    assert one.parent == cache / "mirrors" and one.name.startswith("https_github.com_a_b.git-")
    assert one != two


@pytest.fixture
def with_submodules(tmp_path: Path, upstream: SimpleNamespace) -> SimpleNamespace:
    """PR head P4 on top of P2 adds libs/sub (relative URL ../sub.git) which itself has deep/ (absolute URL)."""
    def bare_repo(name: str, files: list[str]) -> Path:
        work = tmp_path / f"{name}-work"
        git(tmp_path, "init", "-q", str(work))
        for f in files:
            commit(work, f)
        return work

    deep = bare_repo("deep", ["d"])
    git(tmp_path, "clone", "-q", "--bare", str(deep), str(tmp_path / "deep.git"))
    sub = bare_repo("sub", ["s"])
    git(sub, "submodule", "add", "-q", str(tmp_path / "deep.git"), "deep")
    git(sub, "commit", "-qm", "deep")
    git(tmp_path, "clone", "-q", "--bare", str(sub), str(tmp_path / "sub.git"))
    git(upstream.work, "checkout", "-q", upstream.p2)
    git(upstream.work, "submodule", "add", "-q", "../sub.git", "libs/sub")
    git(upstream.work, "commit", "-qm", "sub")
    p4 = git(upstream.work, "rev-parse", "HEAD")
    git(upstream.work, "push", "-qf", str(upstream.bare), f"{p4}:refs/pull/7/head")
    return SimpleNamespace(p4=p4, sub=git(sub, "rev-parse", "HEAD"), deep=git(deep, "rev-parse", "HEAD"),
                           sub_url=str(tmp_path / "sub.git"), deep_url=str(tmp_path / "deep.git"))


def test_submodules_recorded_recursively(upstream: SimpleNamespace, with_submodules: SimpleNamespace) -> None:
    s = with_submodules
    comp = sources.resolve_component(SETTINGS, "verl", pin(s.p4), upstream.url)
    got = [(m.path, m.url, m.commit) for m in comp.submodules]
    assert got == [("libs/sub", s.sub_url, s.sub), ("libs/sub/deep", s.deep_url, s.deep)]
    assert comp.submodules[0].tree == git(s.sub_url, "rev-parse", f"{s.sub}^{{tree}}")
    assert comp.files == 4 + 1 + 2 + 1  # a b p1 p2, .gitmodules, sub: s .gitmodules, deep: d
    again = sources.resolve_component(SETTINGS, "verl", pin(s.p4), upstream.url, offline=True)
    assert again.export_sha256 == comp.export_sha256


def test_submodule_commit_missing_fails(upstream: SimpleNamespace, with_submodules: SimpleNamespace, tmp_path: Path) -> None:
    work = upstream.work
    git(work, "update-index", "--cacheinfo", f"160000,{'2' * 40},libs/sub")
    git(work, "commit", "-qm", "bad gitlink")
    bad = git(work, "rev-parse", "HEAD")
    git(work, "push", "-qf", str(upstream.bare), f"{bad}:refs/pull/7/head")
    with pytest.raises(BadInput, match=f"libs/sub: submodule commit {'2' * 40} of .*sub.git: not found"):
        sources.resolve_component(SETTINGS, "verl", pin(bad), upstream.url)


def test_absolute_url() -> None:
    assert sources.absolute_url("../c.git", "https://h/a/b.git") == "https://h/a/c.git"
    assert sources.absolute_url("./c", "/srv/a/b") == "/srv/a/b/c"
    assert sources.absolute_url("git@h:x/y.git", "/srv/a") == "git@h:x/y.git"


def test_unrelated_history_fails(upstream: SimpleNamespace) -> None:
    git(upstream.work, "checkout", "-q", "--orphan", "lonely")
    orphan = commit(upstream.work, "lonely")
    git(upstream.work, "push", "-q", str(upstream.bare), f"{orphan}:refs/pull/9/head")
    with pytest.raises(BadInput, match=f"{orphan} shares no history with main"):
        sources.resolve_component(SETTINGS, "vllm", pin(orphan, pr=9), upstream.url)


def test_gitlink_without_gitmodules_entry_fails(upstream: SimpleNamespace, with_submodules: SimpleNamespace) -> None:
    work = upstream.work
    git(work, "update-index", "--add", "--cacheinfo", f"160000,{with_submodules.sub},stray")
    git(work, "commit", "-qm", "stray gitlink")
    bad = git(work, "rev-parse", "HEAD")
    git(work, "push", "-qf", str(upstream.bare), f"{bad}:refs/pull/7/head")
    with pytest.raises(BadInput, match="no entry for the submodule at 'stray'"):
        sources.resolve_component(SETTINGS, "verl", pin(bad), upstream.url)


def test_submodule_nesting_limit(upstream: SimpleNamespace, with_submodules: SimpleNamespace,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources, "MAX_DEPTH", 1)  # the fixture nests two levels
    with pytest.raises(BadInput, match="submodules nested deeper than 1"):
        sources.resolve_component(SETTINGS, "verl", pin(with_submodules.p4), upstream.url)


@pytest.fixture
def redirected(tmp_path: Path, upstream: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """PR head P5 adds a submodule `recipe` whose URL is on a public host; BUILDER_GIT_CONFIG
    rewrites that host (url.<base>.insteadOf) to a local directory holding both repositories."""
    recipe = tmp_path / "recipe-work"
    git(tmp_path, "init", "-q", str(recipe))
    sha = commit(recipe, "r")
    git(tmp_path, "clone", "-q", "--bare", str(recipe), str(tmp_path / "recipe.git"))
    work = upstream.work
    git(work, "checkout", "-q", upstream.p2)
    (work / ".gitmodules").write_text('[submodule "recipe"]\n\tpath = recipe\n'
                                      "\turl = https://git.example.invalid/org/recipe.git\n")
    git(work, "add", ".gitmodules")
    git(work, "update-index", "--add", "--cacheinfo", f"160000,{sha},recipe")
    git(work, "commit", "-qm", "recipe")
    p5 = git(work, "rev-parse", "HEAD")
    git(work, "push", "-qf", str(upstream.bare), f"{p5}:refs/pull/7/head")
    config = tmp_path / "mirrors.gitconfig"
    config.write_text(f'[url "{tmp_path}/"]\n\tinsteadOf = https://git.example.invalid/org/\n')
    monkeypatch.setenv("BUILDER_GIT_CONFIG", str(config))
    reread_settings(monkeypatch)
    return SimpleNamespace(p5=p5, recipe=sha, config=config, url="https://git.example.invalid/org/upstream.git")


def test_insteadof_rewrites_the_repository_and_its_submodules(upstream: SimpleNamespace, redirected: SimpleNamespace) -> None:
    comp = sources.resolve_component(SETTINGS, "verl", pin(redirected.p5), redirected.url)
    assert comp.url == redirected.url and comp.commit == redirected.p5
    assert [(s.path, s.url, s.commit) for s in comp.submodules] == [
        ("recipe", "https://git.example.invalid/org/recipe.git", redirected.recipe)]
    assert mirror.mirror_path(SETTINGS, comp.submodules[0].url).exists()  # mirrors keyed by the URL the pins name
    again = sources.resolve_component(SETTINGS, "verl", pin(redirected.p5), redirected.url, offline=True)
    assert again.export_sha256 == comp.export_sha256


def test_insteadof_to_a_missing_directory_is_bad_input(upstream: SimpleNamespace, redirected: SimpleNamespace,
                                                       tmp_path: Path) -> None:
    redirected.config.write_text(f'[url "{tmp_path}/nowhere/"]\n\tinsteadOf = https://git.example.invalid/org/\n')
    with pytest.raises(BadInput, match=f"{redirected.url} \\(rewritten to {tmp_path}/nowhere/upstream.git\\):"
                                       " no such local repository") as err:
        sources.resolve_component(SETTINGS, "verl", pin(redirected.p5), redirected.url)
    assert err.value.exit_code == 2


def test_git_config_setting_must_name_a_file(tmp_path: Path) -> None:
    env = {"BUILDER_GIT_CONFIG": str(tmp_path / "missing.gitconfig")}
    with pytest.raises(BadInput, match="BUILDER_GIT_CONFIG: expected an existing git config file"):
        Settings.from_env(env)
    assert Settings.from_env({}).git_config is None
    (tmp_path / "mirrors.gitconfig").write_text("")
    assert Settings.from_env({"BUILDER_GIT_CONFIG": str(tmp_path / "mirrors.gitconfig")}).git_config == \
        tmp_path / "mirrors.gitconfig"


def test_a_path_and_its_file_url_share_one_mirror(upstream: SimpleNamespace, cache: Path) -> None:
    """`/abs` and `file:///abs` (and `/abs/./`) are one repository: one mirror, one cold fetch."""
    path = upstream.url
    spellings = [path, "file://" + path, path + "/./", "file://localhost" + path + "/"]
    assert {mirror.mirror_path(SETTINGS, url) for url in spellings} == {mirror.mirror_path(SETTINGS, path)}
    mirror.sync(SETTINGS, path, {"refs/heads/main": "refs/remotes/origin/main"})
    mirror.sync(SETTINGS, "file://" + path, {"refs/heads/main": "refs/remotes/origin/main"})
    assert len(list((cache / "mirrors").glob("*.git"))) == 1


def test_distinct_repositories_keep_distinct_mirrors() -> None:
    assert mirror.normalised_url("https://Example.org/a/b/") == "https://example.org/a/b"
    keys = {mirror.mirror_path(SETTINGS, url) for url in ("/a/b", "/a/c", "https://example.org/a/b", "/a/b.git")}
    assert len(keys) == 4
