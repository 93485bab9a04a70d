"""The enroot .sqsh export: whiteouts on a planted image loaded into the real engine, reproducibility,
equivalence with the layers' tree, the provenance smoke on the demo image's .sqsh (and its failure on
a planted modification), the report's Markdown/JSON/JUnit."""
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from builder.core import files as fs
from builder.core import options
from builder.core.constants import SOURCE_DATE_EPOCH
from builder.core.errors import BadInput, NotAccepted
from builder.core.options import Settings
from builder.core.records import SqshExport
from builder.engine import normalize
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.pipeline import releasing
from builder.release import attest, dsse, sqsh
from builder.release import sqsh_rootfs as layers
from builder.release import sqsh_trees as trees
from builder.release.sqsh_rootfs import Entry
from builder.report import document as report
from builder.runners import runc_runner
from builder.runners import sqsh_smoke as smoke
from tests.fixture_types import DemoAccepted, DemoImage, DockerClient, MakeReportInputs

ROOT = Path(__file__).resolve().parents[2]
FAST = "-comp lzo -Xalgorithm lzo1x_1 -noD"  # enroot's compressor, its fast algorithm (the shipped default now)
EPOCH = 946684800


# ---------------------------------------------------------------- a planted image, two layers


def with_lock(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """(pins, lock, sources, build, acceptance) from report_inputs' (pins, sources, build, acceptance)."""
    return (inputs[0], lock_record.of(inputs[0]), *inputs[1:])


def planted_mtime(name: str) -> int:
    """A time of its own for every planted path (the .sqsh keeps each file's time, not one for all)."""
    return EPOCH + sum(name.encode()) * 61


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, mode: int = 0o644, uid: int = 0, gid: int = 0,
         kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid, info.mtime, info.linkname = kind, mode, uid, gid, planted_mtime(name), link
    info.size = len(data) if data is not None else 0
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _layer(build: Callable[[tarfile.TarFile], None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        build(tar)
    return buf.getvalue()


def _lower(tar: tarfile.TarFile) -> None:
    D = tarfile.DIRTYPE
    for d in ("bin", "etc", "opt", "opt/d", "usr", "usr/lib", "var", "var/gone-dir", "dev"):
        _add(tar, d, kind=D, mode=0o755)
    _add(tar, "bin/tool", b"v1\n", mode=0o4755, uid=1000, gid=1000)
    _add(tar, "bin/tool2", kind=tarfile.LNKTYPE, link="bin/tool", mode=0o4755, uid=1000, gid=1000)
    _add(tar, "etc/keep", b"keep\n")
    _add(tar, "etc/gone", b"deleted by the top layer\n")
    _add(tar, "etc/secret", b"mode 0600\n", mode=0o600, uid=0, gid=42)
    _add(tar, "opt/d/x", b"x\n")
    _add(tar, "opt/d/y", b"y\n")
    _add(tar, "usr/lib/libz.so", b"\x7fELF not really\n", mode=0o755)
    _add(tar, "lib", kind=tarfile.SYMTYPE, link="usr/lib", mode=0o777)
    _add(tar, "var/gone-dir/f", b"f\n")
    _add(tar, "dev/stray", b"enroot leaves dev/* out\n")


def _upper(tar: tarfile.TarFile) -> None:
    _add(tar, "etc", kind=tarfile.DIRTYPE, mode=0o755)
    _add(tar, "etc/.wh.gone", b"")
    _add(tar, "opt/d", kind=tarfile.DIRTYPE, mode=0o750)
    _add(tar, "opt/d/.wh..wh..opq", b"")
    _add(tar, "opt/d/z", b"z\n")
    _add(tar, "bin", kind=tarfile.DIRTYPE, mode=0o755)
    _add(tar, "bin/tool", b"v2\n", mode=0o755)
    _add(tar, "var", kind=tarfile.DIRTYPE, mode=0o755)
    _add(tar, "var/.wh.gone-dir", b"")


def _linked_upper(tar: tarfile.TarFile) -> None:
    _upper(tar)
    _add(tar, "etc/keep-again", kind=tarfile.LNKTYPE, link="etc/keep")  # a hard link to a lower layer's file


def _saved_tar(tag: str, upper: Callable[[tarfile.TarFile], None] = _upper) -> tuple[bytes, str]:
    """A `docker save`-shaped tar of the two layers; (bytes, image ID)."""
    blobs = [_layer(_lower), _layer(upper)]
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": ["PATH=/usr/bin:/bin", "I13=a b"], "WorkingDir": "/opt/work",
                         "Cmd": ["/bin/tool", "it's"], "Labels": {"x": "y"}, "Volumes": {"/data": {}}},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(b).hexdigest() for b in blobs]},
              "history": [{"created_by": "lower"}, {"created_by": "upper"}]}
    raw = json.dumps(config, sort_keys=True).encode()
    image_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    manifest = [{"Config": f"{image_id[7:]}.json", "RepoTags": [tag], "Layers": ["l1/layer.tar", "l2/layer.tar"]}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("l1/layer.tar", blobs[0]), ("l2/layer.tar", blobs[1]),
                           (f"{image_id[7:]}.json", raw), ("manifest.json", json.dumps(manifest).encode())):
            _add(tar, name, data)
    return buf.getvalue(), image_id


@pytest.fixture(scope="module")
def planted(docker_client: DockerClient) -> Iterator[str]:
    """The planted image loaded into the engine (`docker load`); its ID. Removed afterwards."""
    data, image_id = _saved_tar("builder-tests/i13-whiteout:test")
    docker_client.images.load(data)
    assert docker_client.images.get(image_id).id == image_id
    yield image_id
    docker_client.images.remove(image_id, force=True)


@pytest.fixture(scope="module")
def planted_sqsh(planted: str, docker_client: DockerClient, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, sqsh.Made]:
    work = tmp_path_factory.mktemp("planted")
    made = sqsh.make_sqsh(docker_client, planted, work / "p.sqsh", FAST, work)
    return work / "p.sqsh", made


@pytest.mark.docker
def test_the_unpacked_copy_is_removed_unless_kept_for_the_smoke(planted_sqsh: tuple[Path, sqsh.Made], planted: str,
                                                               docker_client: DockerClient, tmp_path: Path) -> None:
    """The read-back unpacks into RAM when it has room: a copy nobody removes would hold that memory."""
    _, made = planted_sqsh
    assert made.readback is None and not list(sqsh.RAM_DIR.glob(f".sqsh-readback.{os.getpid()}.*"))
    kept = sqsh.make_sqsh(docker_client, planted, tmp_path / "k.sqsh", FAST, tmp_path, keep_readback=True)
    try:
        assert kept.readback is not None and (kept.readback / "etc" / "environment").is_file()
        assert kept.readback.parent in (sqsh.RAM_DIR, tmp_path)
    finally:
        shutil.rmtree(kept.readback or tmp_path / "none", ignore_errors=True)


# ---------------------------------------------------------------- whiteouts, modes, owners (Docker)


@pytest.mark.docker
def test_top_layer_deletions_are_absent(planted_sqsh: tuple[Path, sqsh.Made], tmp_path: Path) -> None:
    out, made = planted_sqsh
    root = tmp_path / "r"
    sqsh.unsquash(out, root)  # read back from the .sqsh itself
    assert (root / "etc/keep").read_text() == "keep\n"
    assert not (root / "etc/gone").exists() and not os.path.lexists(root / "etc/.wh.gone")
    assert sorted(p.name for p in (root / "opt/d").iterdir()) == ["z"]  # opaque: x and y gone
    assert not (root / "var/gone-dir").exists()
    assert (root / "bin/tool").read_text() == "v2\n" and (root / "bin/tool2").read_text() == "v1\n"
    assert list((root / "dev").iterdir()) == []
    assert os.readlink(root / "lib") == "usr/lib"
    st = os.lstat(root / "bin/tool2")
    assert (oct(st.st_mode & 0o7777), st.st_uid, st.st_gid) == ("0o4755", 1000, 1000)
    st = os.lstat(root / "etc/secret")
    assert (oct(st.st_mode & 0o7777), st.st_gid) == ("0o600", 42)
    assert oct(os.lstat(root / "opt/d").st_mode & 0o777) == "0o750"
    assert (root / "etc/environment").read_text() == "PATH=/usr/bin:/bin\nI13=a b\n"
    assert (root / "opt/work").is_dir()
    assert "exec  '/bin/tool' 'it'\\''s'" in (root / "etc/rc").read_text()
    assert (root / "etc/fstab").read_text() == "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n"
    assert "etc/gone" not in made.expected and made.expected["bin/tool2"].sha256 == hashlib.sha256(b"v1\n").hexdigest()
    times = {p: int(os.lstat(root / p).st_mtime) for p in ("bin/tool", "bin/tool2", "etc/keep", "opt/d", "lib", "etc")}
    assert times == {"bin/tool": planted_mtime("bin/tool"), "bin/tool2": planted_mtime("bin/tool2"),  # its link member
                     "etc/keep": planted_mtime("etc/keep"), "opt/d": planted_mtime("opt/d"), "lib": planted_mtime("lib"),
                     "etc": planted_mtime("etc")}  # the upper layer's own entry, though its whiteout changed etc/
    assert int(os.lstat(root / "etc/environment").st_mtime) == SOURCE_DATE_EPOCH == int(os.lstat(root).st_mtime)


@pytest.mark.docker
def test_engine_agrees_on_the_final_files(planted: str, planted_sqsh: tuple[Path, sqsh.Made], docker_client: DockerClient,
                                          tmp_path: Path) -> None:
    """The engine's own flattening (docker create + export) has the same regular files and contents."""
    _, made = planted_sqsh
    container = docker_client.containers.create(planted, command=["x"], network_mode="none")
    try:
        stream = io.BytesIO(b"".join(container.export()))
    finally:
        container.remove(force=True)
    engine_files = {}
    with tarfile.open(fileobj=stream) as tar:
        for m in tar:
            path = layers._norm(m.name)
            if m.isreg() and not path.startswith("dev/") and path not in (".dockerenv", "etc/hostname", "etc/hosts",
                                                                             "etc/resolv.conf"):
                member = tar.extractfile(m)
                assert member is not None  # a regular file
                engine_files[path] = (hashlib.sha256(member.read()).hexdigest(), int(m.mtime))
            elif m.islnk():
                engine_files[path] = engine_files[layers._norm(m.linkname)]
    ours = {p: (e.sha256, e.mtime) for p, e in made.expected.items() if e.kind == "f" and p not in sqsh.ENROOT_FILES}
    assert ours == engine_files


@pytest.mark.docker
def test_same_image_same_sha256(planted: str, planted_sqsh: tuple[Path, sqsh.Made], docker_client: DockerClient,
                                tmp_path: Path) -> None:
    out, _ = planted_sqsh
    again = tmp_path / "again.sqsh"
    sqsh.make_sqsh(docker_client, planted, again, FAST, tmp_path)
    assert fs.sha256_file(again) == fs.sha256_file(out)


@pytest.mark.docker
def test_a_difference_from_the_layers_is_listed(planted_sqsh: tuple[Path, sqsh.Made], tmp_path: Path) -> None:
    out, made = planted_sqsh
    root = tmp_path / "r"
    sqsh.unsquash(out, root)
    (root / "etc/keep").write_text("changed\n")
    (root / "usr/lib/libz.so").chmod(0o700)
    (root / "opt/d/z").unlink()
    (root / "extra").write_text("new\n")
    diffs = sqsh.compare(made.expected, layers.tree_of(root))
    assert [d.split(":")[0] for d in diffs] == ["etc/keep", "extra", "opt/d", "opt/d/z", "usr/lib/libz.so"]
    assert "sha256" in diffs[0] and "mode 0755 in the image, 0700" in diffs[4]
    now = int(os.lstat(root / "opt/d").st_mtime)
    assert diffs[2] == f"opt/d: mtime {planted_mtime('opt/d')} in the image, {now} in the .sqsh"
    with pytest.raises(NotAccepted, match="5 differences.*etc/keep.*extra"):
        sqsh.check_equal(made.expected, layers.tree_of(root), "x.sqsh")


@pytest.mark.docker
def test_a_layer_that_does_not_match_its_diff_id_is_refused(planted: str, docker_client: DockerClient, tmp_path: Path) -> None:
    saved = layers.save(docker_client, planted, tmp_path / "image.tar")
    with tarfile.open(saved.path) as outer:
        inner = tarfile.open(fileobj=outer.extractfile(saved.layers[0]))
        at = saved.layers[0].offset_data + inner.getmember("etc/keep").offset_data
    with open(saved.path, "r+b") as fh:  # same size, one byte of etc/keep changed
        fh.seek(at)
        fh.write(b"K")
    with pytest.raises(BadInput, match="layer 0 .* hashes to sha256:.*the config says"):
        layers.expected_tree(layers.open_saved(saved.path, planted))


# ---------------------------------------------------------------- the base tree kept between exports


@pytest.mark.docker
def test_a_kept_base_tree_gives_the_same_sqsh_and_stays_unchanged(planted: str, planted_sqsh: tuple[Path, sqsh.Made],
                                                                  docker_client: DockerClient, tmp_path: Path) -> None:
    """The lower layer plays the base: the first export keeps its tree, the second starts from it, applies only
    the upper layer, and writes the same bytes; the kept tree is untouched by the upper layer's deletions."""
    cold_out, cold = planted_sqsh
    kept = tmp_path / "trees"
    kept.mkdir()
    base = layers.open_saved(*_planted_file(tmp_path)).config["rootfs"]["diff_ids"][:1]
    first = sqsh.make_sqsh(docker_client, planted, tmp_path / "a.sqsh", FAST, _fresh(tmp_path / "w1"), kept, base)
    assert first.reused == 0 and first.kept is not None
    trees.keep(kept, first.kept)
    second = sqsh.make_sqsh(docker_client, planted, tmp_path / "b.sqsh", FAST, _fresh(tmp_path / "w2"), kept, base)
    assert second.reused == 1 and second.kept is None and second.expected == cold.expected
    assert fs.sha256_file(tmp_path / "b.sqsh") == fs.sha256_file(tmp_path / "a.sqsh") == fs.sha256_file(cold_out)
    tree = trees.find(kept, base)
    assert tree is not None and tree.count == 1
    assert (tree.rootfs / "etc/gone").read_text() == "deleted by the top layer\n"  # deleted above, kept here
    assert (tree.rootfs / "bin/tool").read_text() == "v1\n" and sorted(os.listdir(tree.rootfs / "opt/d")) == ["x", "y"]
    assert oct(os.lstat(tree.rootfs / "bin/tool").st_mode & 0o7777) == "0o4755"
    assert layers.tree_of(tree.rootfs) == {p: e for p, e in tree.entries.items()}


def _planted_file(tmp_path: Path, upper: Callable[[tarfile.TarFile], None] = _upper) -> tuple[Path, str]:
    data, image_id = _saved_tar("builder-tests/i13-whiteout:test", upper)
    path = tmp_path / f"saved-{image_id[7:19]}.tar"
    path.write_bytes(data)
    return path, image_id


def test_a_hard_link_across_layers_never_touches_the_kept_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer that hard-links a lower layer's file would change an inode the kept tree shares: that export
    applies every layer instead, and gives the bytes of an export without any kept tree."""
    path, image_id = _planted_file(tmp_path, _linked_upper)
    saved = layers.open_saved(path, image_id)
    with pytest.raises(layers.SharedInode, match="etc/keep-again hard-links etc/keep"):
        layers.apply_layers(saved, _fresh(tmp_path / "r"), private_from=1)

    def save(client: object, image: str, dest: Path) -> layers.SavedImage:
        dest.write_bytes(path.read_bytes())
        return layers.open_saved(dest, image)

    monkeypatch.setattr(layers, "save", save)
    kept, base = tmp_path / "trees", saved.config["rootfs"]["diff_ids"][:1]
    kept.mkdir()
    cold = sqsh.make_sqsh(None, image_id, tmp_path / "cold.sqsh", FAST, _fresh(tmp_path / "w0"))
    first = sqsh.make_sqsh(None, image_id, tmp_path / "a.sqsh", FAST, _fresh(tmp_path / "w1"), kept, base)
    assert first.kept is None and first.expected == cold.expected  # the snapshot was dropped, not kept
    assert not list(kept.iterdir())
    _add_kept(kept, tmp_path / "lower", saved)  # a tree kept by another image on the same base
    inode = os.lstat(kept / trees.key(base) / "rootfs/etc/keep")
    second = sqsh.make_sqsh(None, image_id, tmp_path / "b.sqsh", FAST, _fresh(tmp_path / "w2"), kept, base)
    assert second.reused == 0 and second.expected == cold.expected
    assert fs.sha256_file(tmp_path / "b.sqsh") == fs.sha256_file(tmp_path / "a.sqsh") == fs.sha256_file(tmp_path / "cold.sqsh")
    after = os.lstat(kept / trees.key(base) / "rootfs/etc/keep")
    assert (after.st_ino, after.st_mode, after.st_nlink) == (inode.st_ino, inode.st_mode, inode.st_nlink)


def _fresh(path: Path) -> Path:
    path.mkdir()
    return path


def _add_kept(kept: Path, rootfs: Path, saved: layers.SavedImage) -> None:
    rootfs.mkdir()
    one = layers.SavedImage(path=saved.path, image_id=saved.image_id, config=saved.config, layers=saved.layers[:1])
    xattrs = layers.apply_layers(one, rootfs)
    entries = layers.expected_tree(layers.SavedImage(path=saved.path, image_id=saved.image_id,
                                                     config={"rootfs": {"diff_ids": saved.config["rootfs"]["diff_ids"][:1]}},
                                                     layers=saved.layers[:1]))
    trees.keep(kept, trees.snapshot(kept, rootfs, saved.config["rootfs"]["diff_ids"][:1], entries, xattrs))


def test_kept_trees_are_found_by_the_longest_prefix_and_the_least_recently_used_go(tmp_path: Path) -> None:
    kept, rootfs = tmp_path / "trees", tmp_path / "rootfs"
    kept.mkdir()
    (rootfs / "d").mkdir(parents=True)
    (rootfs / "d/f").write_text("f\n")
    entries = layers.tree_of(rootfs)
    ids = [f"sha256:{c * 64}" for c in "abcd"]
    for n in (1, 2, 3):
        trees.keep(kept, trees.snapshot(kept, rootfs, ids[:n], entries, False))
        os.utime(kept / trees.key(ids[:n]), (n, n))  # kept in this order
    assert sorted(p.name for p in kept.iterdir()) == sorted(trees.key(ids[:n]) for n in (2, 3))  # KEEP = 2
    found = trees.find(kept, ids)
    assert found is not None and found.count == 3 and found.entries == entries and not found.xattrs
    assert trees.find(kept, ids[:1]) is None and trees.find(kept, ["sha256:" + "e" * 64]) is None
    assert (found.rootfs / "d/f").read_text() == "f\n"


# ---------------------------------------------------------------- no Docker


def test_a_member_through_a_symlink_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    (root / "lib").symlink_to("/etc")
    assert layers._inside(root, "usr/lib/x") == root / "usr/lib/x"
    with pytest.raises(BadInput, match="'lib/passwd': its parent goes through a symlink"):
        layers._inside(root, "lib/passwd")


def test_squash_options_default_is_enroots_with_the_fast_lzo() -> None:
    assert options.Settings.from_env({}).squash_options == "-comp lzo -Xalgorithm lzo1x_1 -noD"
    assert options.Settings.from_env({"BUILDER_SQUASH_OPTIONS": FAST}).squash_options == FAST
    for bad in ("-comp lzo; rm -rf /", "-ef /etc/passwd", "-comp $(x)"):
        with pytest.raises(BadInput, match="BUILDER_SQUASH_OPTIONS"):
            options.Settings.from_env({"BUILDER_SQUASH_OPTIONS": bad})


def test_enroot_files_follow_the_config() -> None:
    files = sqsh.enroot_files({"config": {"Env": ["A=1"], "Entrypoint": ["/e"], "Cmd": ["c"]}})
    assert files["etc/environment"] == b"A=1\n" and files["etc/fstab"] == b""
    rc = files["etc/rc"].decode()
    assert 'cd "/" && unset OLDPWD' in rc and "exec '/e' \"$@\"" in rc and "exec '/e' 'c'" in rc
    assert b"exec  '/bin/sh'" in sqsh.enroot_files({})["etc/rc"]


def test_compare_checks_kind_owner_target_and_xattrs() -> None:
    f = Entry(kind="f", mode=0o644, uid=0, gid=0, sha256="a" * 64)
    link = Entry(kind="l", mode=0o777, uid=0, gid=0, target="x")
    got = {"a": Entry(kind="d", mode=0o644, uid=0, gid=0), "b": Entry(kind="f", mode=0o644, uid=1, gid=0, sha256="a" * 64),
           "c": Entry(kind="l", mode=0o777, uid=0, gid=0, target="y"),
           "d": Entry(kind="f", mode=0o644, uid=0, gid=0, sha256="a" * 64, xattrs=(("user.k", b"v"),))}
    got["e"] = Entry(kind="f", mode=0o644, uid=0, gid=0, sha256="a" * 64, mtime=946684800)
    diffs = sqsh.compare({"a": f, "b": f, "c": link, "d": f, "e": replace(f, mtime=1796135237)}, got)
    assert [d.split(": ", 1)[1].split()[0] for d in diffs] == ["kind", "owner", "symlink", "xattrs", "mtime"]


def _record(**kw: Any) -> SqshExport:
    fields: dict[str, Any] = dict(path="/x/demo+unified+TAG.sqsh", sha256="5" * 64, size=1026101248, compression="-comp lzo -noD",
                  mksquashfs="mksquashfs version 4.5.1", mksquashfs_args=[], image_id="sha256:" + "ab" * 32,
                  tag="TAG", registry_digest="sha256:" + "9" * 64, entries=10, files=8, xattrs=False,
                  enroot_files={}, equivalence="pass", smoke={"status": "pass", "reason": "ok"}, seconds={},
                  created="2026-11-29T00:00:00Z")
    fields.update(kw)
    return SqshExport(**fields)


def test_report_carries_the_sqsh_beside_the_registry_digest(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    rep = report.make_report(*with_lock(report_inputs()))
    rep = rep.model_copy(update={"sqsh": _record()})
    paths = report.write(rep, tmp_path)
    row = next(line for line in paths["md"].read_text().splitlines() if "5" * 64 in line)
    assert "`TAG`" in row and "sha256:" + "9" * 64 in row and "-comp lzo -noD" in row and "provenance pass" in row
    assert report.load(paths["json"]).sqsh == rep.sqsh
    suite = ET.fromstring(paths["junit"].read_text())
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["sqsh_sha256"] == "5" * 64 and props["sqsh_registry_digest"] == "sha256:" + "9" * 64
    assert props["sqsh_compression"] == "-comp lzo -noD" and props["sqsh_size"] == "1026101248"
    assert [c.get("name") for c in suite.iter("testcase")][-1] == "sqsh_smoke" and suite.get("tests") == "6"


def test_export_refuses_a_report_that_is_not_accepted(report_inputs: MakeReportInputs, settings: Settings,
                                                      tmp_path: Path) -> None:
    rep = report.make_report(*with_lock(report_inputs(statuses={"rl_step": "fail"})))
    path = report.write(rep, tmp_path)["json"]
    with pytest.raises(NotAccepted, match="only an ACCEPTED image is exported"):
        releasing.export_sqsh(path, settings)
    out = subprocess.run([sys.executable, "-m", "builder.cli", "export-sqsh", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "NOT ACCEPTED" in out.stderr
    assert not list(tmp_path.glob("*.sqsh*"))


def test_export_refuses_a_bad_out_before_any_work(report_inputs: MakeReportInputs, settings: Settings, tmp_path: Path) -> None:
    path = report.write(report.make_report(*with_lock(report_inputs())), tmp_path)["json"]
    for bad in (tmp_path / "image.tar", tmp_path / "missing" / "x.sqsh"):
        with pytest.raises(BadInput, match="expected a file name ending in .sqsh in an existing directory"):
            releasing.export_sqsh(path, settings, out=bad)
    with pytest.raises(BadInput, match="--squash-options"):
        releasing.export_sqsh(path, settings, squash_options="-comp lzo -ef /etc/x")


def test_run_sqsh_without_publish_is_bad_input() -> None:
    out = subprocess.run([sys.executable, "-m", "builder.cli", "run", "pins/demo.yaml", "--sqsh"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--sqsh: expected --publish" in out.stderr


# ---------------------------------------------------------------- the demo image (Docker)


@pytest.fixture(scope="module")
def demo_sqsh(demo_accepted: DemoAccepted, docker_client: DockerClient, settings: Settings,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SqshExport]:
    """An ACCEPTED report of the demo image and its .sqsh export (fast lzo for CI), exported with a signing key (the
    smoke's own signed test result, placement.dsse.json: the key pair sits beside the report as key, key.pub)."""
    pins, sources, built, acceptance = demo_accepted
    run = tmp_path_factory.mktemp("sqsh-run")
    path = report.write(report.make_report(pins, lock_record.of(pins), sources, built, acceptance), run)["json"]
    assert report.load(path).verdict == "ACCEPTED"
    releasing.keygen(run / "key")
    return path, releasing.export_sqsh(path, settings, squash_options=FAST, key=run / "key")


@pytest.mark.docker
def test_demo_sqsh_recorded_checked_and_smoked(demo_sqsh: tuple[Path, SqshExport]) -> None:
    path, record = demo_sqsh
    rep = report.load(path)
    assert rep.sqsh == record and record.image_id == rep.image_id and record.tag == rep.tags[0]
    out, pointer = Path(record.path), Path(record.pointer)  # kept by its sha256, named per platform under the tag
    assert out.name == f"sha256-{record.sha256}.sqsh" and out.stat().st_size == record.size
    assert pointer.name == f"demo+unified+{rep.tags[0]}.linux-amd64.sqsh" and pointer.resolve() == out.resolve()
    assert os.readlink(pointer) == out.name and pointer.parent == out.parent == path.parent
    check = subprocess.run(["sha256sum", "-c", out.name + ".sha256"], cwd=out.parent, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert record.equivalence == "pass" and record.files > 1000 and record.compression == FAST
    assert record.smoke["status"] == "pass" and record.smoke["network"] == "none"
    assert "-all-time" not in record.mksquashfs_args and "-no-xattrs" in record.mksquashfs_args
    assert record.mtimes == "layers"
    assert record.sha256 in (path.parent / "report.md").read_text()
    envelope = json.loads((path.parent / attest.PLACEMENT_ENVELOPE).read_text())  # sqsh_smoke's signed result
    stmt = dsse.open_envelope(envelope, dsse.load_public(path.parent / "key.pub"))
    assert stmt["subject"] == [{"name": pointer.name, "digest": {"sha256": record.sha256}}]
    assert stmt["predicate"]["result"] == "PASSED" and stmt["predicate"]["passedTests"] == ["sqsh_smoke"]


def stale_pycs(root: Path) -> tuple[int, list[str]]:
    """(timestamp .pyc files checked, those whose recorded source mtime or size is not the source's): Python
    recompiles a stale one on every import, and cannot write the fresh one into a read-only image."""
    checked, stale = 0, []
    for pyc in sorted(root.rglob("__pycache__/*.pyc")):
        source = pyc.parent.parent / (pyc.name.split(".", 1)[0] + ".py")
        head = pyc.read_bytes()[:16]
        if not source.is_file() or struct.unpack("<I", head[4:8])[0] != 0:  # no source, or a hash-based .pyc
            continue
        checked += 1
        st = source.stat()
        if struct.unpack("<II", head[8:16]) != (int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF):
            stale.append(str(pyc.relative_to(root)))
    return checked, stale


@pytest.mark.docker
def test_the_images_bytecode_stays_valid_in_the_sqsh(demo_sqsh: tuple[Path, SqshExport], tmp_path: Path) -> None:
    """Each file keeps its layer's mtime: the image's .pyc files still match their sources (with one time for all,
    every gate on the cluster recompiled torch and the stack in memory)."""
    _, record = demo_sqsh
    site = "opt/venv/lib/python3.11/site-packages"
    subprocess.run(["unsquashfs", "-no-progress", "-quiet", "-d", str(tmp_path / "r"), record.path, f"{site}/tinyrl",
                    f"{site}/torch/nn", f"{site}/torch/__init__.py", f"{site}/torch/__pycache__"], check=True,
                   capture_output=True)
    checked, stale = stale_pycs(tmp_path / "r")
    assert checked > 50 and stale == [], (checked, stale[:5])
    pyc = tmp_path / "r" / site / "torch/__pycache__/__init__.cpython-311.pyc"  # a timestamp .pyc (the base's)
    os.utime(pyc.parent.parent / "__init__.py", (EPOCH, EPOCH))  # the check itself tells a stale one
    assert stale_pycs(tmp_path / "r")[1] == [str(pyc.relative_to(tmp_path / "r"))]


@pytest.mark.docker
def test_smoke_fails_on_a_planted_modification(demo_sqsh: tuple[Path, SqshExport], docker_client: DockerClient,
                                               tmp_path: Path) -> None:
    path, record = demo_sqsh
    root = tmp_path / "r"
    sqsh.unsquash(Path(record.path), root)
    manifest = json.loads((root / "opt/delivery/manifest.json").read_text())
    victim = sorted(manifest["components"]["vllm"]["files"])[0]
    with open(root / victim.lstrip("/"), "a") as fh:
        fh.write("\n# planted\n")
    loaded = report.load(path)
    result = smoke.provenance_on_rootfs(pins_mod.load(loaded.sources.pins_path), root)
    assert result["status"] == "fail", result
    assert f"{victim} sha256" in result["reason"] or any(victim in f for f in result["failures"]), result
    assert result["network"] == "none" and result["container"].startswith(runc_runner.PREFIX)
    listed = subprocess.run([runc_runner.runc(), "list", "-q"], capture_output=True, text=True, check=True).stdout
    assert result["container"] not in listed.split()  # deleted after the gate


@pytest.mark.docker
def test_a_warm_export_reads_only_the_layers_above_the_kept_tree_from_the_build_store(
        demo_image: DemoImage, demo_sqsh: tuple[Path, SqshExport], docker_client: DockerClient, settings: Settings,
        tmp_path: Path) -> None:
    """The build's own layer blobs stand in for `docker save` once the base tree is kept: the same bytes as the
    session's export of the image (the one that kept the tree), the same tree as the engine's save of every layer.
    Over 60 s under load (80 s in the last CI run): the engine's `docker save` of the whole image and its unpacked
    tree are the reference the warm export is compared with."""
    pins, _, _, built = demo_image
    _, record = demo_sqsh
    assert record.image_id == built.image_id
    stored = normalize.stored_image(settings, built.image_id)
    assert stored is not None and stored[1][-1] is not None and stored[1][0] is None  # added layers only
    base = sqsh.base_layers(docker_client, str(pins.base.image))
    assert base and all(blob is None for blob in stored[1][:len(base)])
    kept_trees = settings.cache("sqsh", "trees")
    assert trees.find(kept_trees, base) is not None  # kept by the session's first export on the base
    warm = sqsh.make_sqsh(docker_client, built.image_id, tmp_path / "b.sqsh", FAST, _fresh(tmp_path / "w"),
                          kept_trees, base, stored)
    assert "layers from the blob store" in warm.times and "docker save" not in warm.times
    assert warm.reused == len(base) and warm.kept is None
    assert fs.sha256_file(tmp_path / "b.sqsh") == record.sha256
    (tmp_path / "b.sqsh").unlink()
    if "docker save" not in record.seconds:  # that export was warm too (or a cache hit): the engine's save here
        saved = layers.save(docker_client, built.image_id, tmp_path / "image.tar")
        full, written = layers.expected_tree(saved), set(sqsh.enroot_files(saved.config))  # written over the layers
        (tmp_path / "image.tar").unlink()
        assert {p: e for p, e in warm.expected.items() if p not in written} == \
            {p: e for p, e in full.items() if p not in written}


@pytest.mark.docker
def test_exporting_an_exported_digest_again_is_a_checked_cache_hit(demo_sqsh: tuple[Path, SqshExport], settings: Settings,
                                                                   tmp_path: Path) -> None:
    path, record = demo_sqsh
    again = releasing.export_sqsh(path, settings, squash_options=FAST, out=tmp_path / "again.sqsh")
    assert "cache hit" in again.seconds and again.sha256 == record.sha256 and again.image_id == record.image_id
    kept = tmp_path / f"sha256-{record.sha256}.sqsh"  # copied here by digest, `again.sqsh` the pointer onto it
    assert os.readlink(tmp_path / "again.sqsh") == kept.name and again.path == str(kept)
    assert (tmp_path / f"{kept.name}.sha256").read_text() == f"{record.sha256}  {kept.name}\n"
    assert report.load(path).sqsh == again
    # an index entry of our own (another mksquashfs version string) on a copy: a hit while intact ...
    rep, copy = report.load(path), tmp_path / "copy.sqsh"
    copy.write_bytes(Path(record.path).read_bytes())
    sqsh.remember(settings, record.model_copy(update={"path": str(copy), "mksquashfs": "planted"}), True)
    assert sqsh.cached_export(settings, rep, tmp_path / "third.sqsh", FAST, "planted", True) is not None
    # ... planted: the earlier .sqsh changed on disk -> no hit (its sha256 read in full), nothing copied
    with open(copy, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\0planted\0")
    (tmp_path / "third.sqsh").unlink()
    assert sqsh.cached_export(settings, rep, tmp_path / "third.sqsh", FAST, "planted", True) is None
    assert not (tmp_path / "third.sqsh").exists()
    # other options, or an unsmoked export when a smoked one is asked for, are other exports
    assert sqsh.cached_export(settings, rep, tmp_path / "third.sqsh", "-comp gzip", record.mksquashfs, True) is None
    assert sqsh.cached_export(settings, rep, tmp_path / "third.sqsh", FAST, record.mksquashfs, False) is None
