"""export_tar / file_manifest against a real `git worktree` checkout of the same commit."""
import hashlib
import io
import os
import stat
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pygit2
import pytest

from builder.core.errors import BadInput
from builder.sources import treetar as export

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_AUTHOR_DATE": "2024-02-03T04:05:06Z",
       "GIT_COMMITTER_DATE": "2024-02-03T04:05:06Z", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}
LONG = "long-" + "d" * 60 + "/" + "f" * 90 + ".txt"  # over 100 bytes: needs a GNU long-name record


def git(cwd: str | Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "protocol.file.allow=always", "-c", "init.defaultBranch=main", *args],
                         cwd=cwd, env={**os.environ, **ENV}, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def write(root: Path, rel: str, text: str, executable: bool = False) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if executable:
        path.chmod(0o755)


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, Path]:
    """A work repo with exec files, symlinks, a long path, unicode, and a submodule at vendor/lib."""
    lib = tmp_path / "lib"
    git(tmp_path, "init", "-q", str(lib))
    write(lib, "lib.py", "print('lib')\n")
    write(lib, "tool.sh", "#!/bin/sh\n", executable=True)
    git(lib, "add", "-A")
    git(lib, "commit", "-qm", "lib")
    work = tmp_path / "work"
    git(tmp_path, "init", "-q", str(work))
    write(work, "README.md", "hello\n")
    write(work, "bin/run", "#!/bin/sh\necho run\n", executable=True)
    write(work, "pkg/mod.py", "x = 1\n")
    write(work, "pkg-a/z.txt", "sorts between pkg and pkg/\n")
    write(work, "pkg.txt", "file next to dir\n")
    write(work, LONG, "long\n")
    write(work, "données/é.txt", "unicode\n")
    os.symlink("pkg/mod.py", work / "link-to-file")
    os.symlink("../README.md", work / "pkg" / "up-one")
    os.symlink("pkg", work / "link-to-dir")
    git(work, "add", "-A")
    git(work, "submodule", "add", "-q", str(lib), "vendor/lib")
    git(work, "commit", "-qm", "all")
    return work, lib


def modules_from(lib: Path) -> Callable[[str, str], pygit2.Repository]:
    def lookup(path: str, sha: str) -> pygit2.Repository:
        assert path == "vendor/lib"
        return pygit2.Repository(str(lib))
    return lookup


def tree_of(root: Path) -> dict[str, Any]:
    """{path: (kind, exec bit, content or link target)} of a directory, .git files left out."""
    out: dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in dirs + files:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if name == ".git" or (path.is_dir() and not path.is_symlink()):
                continue
            if path.is_symlink():
                out[rel] = ("link", None, os.readlink(path))
            else:
                out[rel] = ("file", bool(path.stat().st_mode & stat.S_IXUSR), path.read_bytes())
    return out


def export_bytes(repo: Any, commit: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    export.export_tar(repo, commit, buf, **kw)
    return buf.getvalue()


def test_export_matches_a_git_worktree_checkout(repo: tuple[Path, Path], tmp_path: Path) -> None:
    work, lib = repo
    head = git(work, "rev-parse", "HEAD")
    checkout = tmp_path / "checkout"
    git(work, "worktree", "add", "-q", "--detach", str(checkout), head)
    git(checkout, "submodule", "update", "-q", "--init")
    data = export_bytes(str(work), head, modules=modules_from(lib))
    extracted = tmp_path / "extracted"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        safe: dict[str, Any] = {"filter": "tar"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(extracted, **safe)
    ours = tree_of(extracted)
    assert ours == tree_of(checkout)
    assert ours["bin/run"][1] is True and ours["README.md"][1] is False
    assert ours["vendor/lib/tool.sh"] == ("file", True, b"#!/bin/sh\n")
    assert ours["pkg/up-one"] == ("link", None, "../README.md")
    assert LONG in ours and "données/é.txt" in ours


def test_tar_metadata_is_normalised(repo: tuple[Path, Path]) -> None:
    work, lib = repo
    head = git(work, "rev-parse", "HEAD")
    with tarfile.open(fileobj=io.BytesIO(export_bytes(str(work), head, modules=modules_from(lib)))) as tar:
        members = tar.getmembers()
    mtime = pygit2.Repository(str(work))[head].committer.time
    assert mtime == 1706933106
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(mtime, 0, 0, "", "")}
    keys = [m.name.encode() + (b"/" if m.isdir() else b"") for m in members]
    assert keys == sorted(keys)
    modes = {m.name: m.mode for m in members}
    assert modes["bin"] == modes["vendor/lib"] == 0o755 and modes["bin/run"] == 0o755
    assert modes["README.md"] == 0o644 and modes["vendor/lib/lib.py"] == 0o644
    assert [m.name for m in members if m.issym()] == ["link-to-dir", "link-to-file", "pkg/up-one"]


def test_export_is_byte_identical_across_runs_and_clones(repo: tuple[Path, Path], tmp_path: Path) -> None:
    work, lib = repo
    head = git(work, "rev-parse", "HEAD")
    first = export_bytes(str(work), head, modules=modules_from(lib))
    assert export_bytes(str(work), head, modules=modules_from(lib)) == first
    clone, lib_clone = tmp_path / "clone.git", tmp_path / "lib-clone.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(clone))
    git(tmp_path, "clone", "-q", "--bare", str(lib), str(lib_clone))
    assert export_bytes(str(clone), head, modules=modules_from(lib_clone)) == first
    stats = export.export_tar(str(clone), head, None, modules=modules_from(lib_clone))
    assert stats.sha256 == hashlib.sha256(first).hexdigest() and stats.size == len(first)
    assert len(first) % tarfile.RECORDSIZE == 0


def test_prefix_puts_everything_below_it(repo: tuple[Path, Path]) -> None:
    work, lib = repo
    head = git(work, "rev-parse", "HEAD")
    with tarfile.open(fileobj=io.BytesIO(export_bytes(str(work), head, prefix="src/verl",
                                                      modules=modules_from(lib)))) as tar:
        names = tar.getnames()
    assert names[:2] == ["src", "src/verl"] and all(n.startswith("src/verl/") for n in names[2:])


def test_manifest_matches_checkout_and_file_count(repo: tuple[Path, Path]) -> None:
    work, lib = repo
    head = git(work, "rev-parse", "HEAD")
    manifest = export.file_manifest(str(work), head, modules=modules_from(lib))
    assert manifest["README.md"] == hashlib.sha256(b"hello\n").hexdigest()
    assert manifest["link-to-file"] == hashlib.sha256(b"pkg/mod.py").hexdigest()
    assert manifest["vendor/lib/lib.py"] == hashlib.sha256(b"print('lib')\n").hexdigest()
    stats = export.export_tar(str(work), head, None, modules=modules_from(lib))
    assert stats.files == len(manifest) == 13


def test_submodule_without_its_repository_fails(repo: tuple[Path, Path]) -> None:
    work, _ = repo
    with pytest.raises(BadInput, match="vendor/lib: submodule at .* needs its mirror"):
        export.export_tar(str(work), git(work, "rev-parse", "HEAD"), None)


@pytest.mark.parametrize("target", ["/etc/passwd", "../outside", "pkg/../../outside", "a/../../../x"])
def test_escaping_symlink_rejected(tmp_path: Path, target: str) -> None:
    work = tmp_path / "w"
    git(tmp_path, "init", "-q", str(work))
    write(work, "ok.txt", "ok")
    os.symlink(target, work / "evil")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "evil")
    with pytest.raises(BadInput, match="evil: symlink target .* (is absolute|escapes the tree)"):
        export.export_tar(str(work), git(work, "rev-parse", "HEAD"), io.BytesIO())
    with pytest.raises(BadInput, match="evil: symlink target"):
        export.file_manifest(str(work), git(work, "rev-parse", "HEAD"))


def test_inside_symlinks_accepted() -> None:
    for path, target in [(b"a/b/link", b"../c"), (b"a/link", b"./../x"), (b"link", b"a/b/../c")]:
        export._check_link(path, target)


def test_unknown_commit_is_bad_input(repo: tuple[Path, Path]) -> None:
    work, _ = repo
    with pytest.raises(BadInput, match=f"commit {'3' * 40} not found"):
        export.export_tar(str(work), "3" * 40, None)


def test_header_block_reads_back_with_tarfile() -> None:
    long_name = b"x/" * 80 + b"name"
    raw = export._header(long_name, export.FILE, 0o755, 1700000000, 3) + export._pad(b"abc") + b"\0" * 1024
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.mode, member.mtime, member.size) == (long_name.decode(), 0o755, 1700000000, 3)
        fh = tar.extractfile(member)
        assert fh is not None and fh.read() == b"abc"


def test_symlink_escaping_through_another_symlink_rejected(tmp_path: Path) -> None:
    work = tmp_path / "w"
    git(tmp_path, "init", "-q", str(work))
    (work / "a").mkdir()
    os.symlink("../b", work / "a" / "l1")  # inside: resolves to b
    os.symlink("a/l1/../..", work / "c")  # lexically inside, but a/l1 is b, so b/../.. is above the root
    git(work, "add", "-A")
    git(work, "commit", "-qm", "chain")
    with pytest.raises(BadInput, match="c: symlink target 'a/l1/../..' escapes the tree through another symlink"):
        export.export_tar(str(work), git(work, "rev-parse", "HEAD"), io.BytesIO())


def test_stays_inside_follows_links() -> None:
    links = {b"a/l1": b"../b", b"loop": b"loop", b"d": b"a"}
    assert export._stays_inside(links, b"x", b"d/l1/sub")  # a/l1 -> b, b/sub: inside
    assert not export._stays_inside(links, b"c", b"a/l1/../..")
    assert not export._stays_inside(links, b"loop", b"loop")


def test_export_file_writes_whole_tar_or_nothing(repo: tuple[Path, Path], tmp_path: Path) -> None:
    work, lib = repo
    head = git(work, "rev-parse", "HEAD")
    out = tmp_path / "out.tar"
    stats = export.export_file(str(work), head, out, modules=modules_from(lib))
    assert out.read_bytes() == export_bytes(str(work), head, modules=modules_from(lib))
    assert stats.size == out.stat().st_size
    bad = tmp_path / "bad.tar"
    with pytest.raises(BadInput, match="needs its mirror"):
        export.export_file(str(work), head, bad)
    assert not bad.exists() and not (tmp_path / "bad.tar.part").exists()
