"""The released .sqsh layout (builder/release/sqsh_layout.py): the file kept by its sha256 with its `.sha256`, a
pointer per platform under the SHA tag flipped in one rename, a pointer that follows its tag's digest, and gc that
keeps every file a pointer names."""
from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

from builder.core import files as fs
from builder.core.options import Settings
from builder.core.records import SqshExport
from builder.nightly import gc
from builder.release import sqsh_layout as layout

REPO = "127.0.0.1:5000/demo/unified"
TAG = "vllm-aaaaaaa-megatron-bbbbbbb-verl-ccccccc"
OLD, NEW = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def settings(tmp_path: Path) -> Settings:
    return replace(Settings.from_env({}), cache_root=tmp_path / "cache")


def kept(directory: Path, data: bytes) -> tuple[Path, str]:
    sha = hashlib.sha256(data).hexdigest()
    part = fs.part_path(layout.blob_path(directory, sha))
    part.write_bytes(data)
    return layout.keep(part, sha)[0], sha


def move(blob: Path, pointer: Path, sha: str) -> layout.SqshMove:
    record = SqshExport(path=str(blob), sha256=sha, size=blob.stat().st_size, compression="", mksquashfs="",
                        mksquashfs_args=[], image_id="sha256:" + "9" * 64, tag=TAG, registry_digest=NEW, entries=0,
                        files=0, xattrs=False, enroot_files={}, equivalence="pass", smoke={}, seconds={}, created="")
    return layout.SqshMove(blob=str(blob), pointer=str(pointer), sha256=sha, record=record)


def test_names_carry_the_digest_and_the_platform(tmp_path: Path) -> None:
    pointer = layout.pointer_path(tmp_path, REPO, "demo", TAG, "linux/arm64/v8")
    assert pointer.name == f"demo+unified+{TAG}.linux-arm64-v8.sqsh"
    blob, sha = kept(tmp_path, b"squashfs bytes")
    assert blob.name == f"sha256-{sha}.sqsh"
    assert (tmp_path / f"{blob.name}.sha256").read_text() == f"{sha}  {blob.name}\n"
    again, _ = kept(tmp_path, b"squashfs bytes")  # the same bytes kept again: one file, no part left
    assert again == blob and sorted(p.name for p in tmp_path.iterdir()) == [blob.name, blob.name + ".sha256"]
    blob.write_bytes(b"squashfs BYTES")  # changed on disk, same size: keeping the checked bytes again replaces it
    assert kept(tmp_path, b"squashfs bytes") == (blob, sha) and blob.read_bytes() == b"squashfs bytes"


def test_a_reader_never_sees_a_missing_or_disagreeing_sqsh_while_the_pointer_flips(tmp_path: Path) -> None:
    """Planted: unlink the pointer then link it again (two steps) instead of one rename: the reader sees it
    missing."""
    blobs = [kept(tmp_path, bytes([i]) * 4096) for i in range(2)]
    pointer = layout.pointer_path(tmp_path, REPO, "demo", TAG, "linux/amd64")
    layout.point(pointer, blobs[0][0])
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:  # as a consumer reads it: the pointer resolved once, then that file and its .sha256
                blob = pointer.parent / os.readlink(pointer)
                data = blob.read_bytes()
                sums = layout.sums_path(blob).read_text().split()[0]
            except OSError as err:
                seen.append(f"missing: {err}")
                continue
            if hashlib.sha256(data).hexdigest() != sums:
                seen.append("the .sqsh and its .sha256 disagree")

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 0.5
    flips = 0
    while time.monotonic() < deadline:
        layout.point(pointer, blobs[flips % 2][0])
        flips += 1
    stop.set()
    reader.join()
    assert seen == [], f"{len(seen)} bad reads in {flips} flips, first: {seen[0]}"
    assert [p.name for p in tmp_path.iterdir() if fs.PART in p.name] == []


def test_flip_checks_the_kept_file_and_a_pointer_follows_its_tags_digest(tmp_path: Path) -> None:
    here = settings(tmp_path)
    one, two = tmp_path / "shared", tmp_path / "run"
    one.mkdir()
    two.mkdir()
    old_blob, old_sha = kept(one, b"old image")
    old = move(old_blob, layout.pointer_path(one, REPO, "demo", TAG, "linux/amd64"), old_sha)
    assert layout.flip(old, REPO, OLD, "linux/amd64", here, check=True)
    other = layout.pointer_path(one, REPO, "demo", TAG, "linux/arm64")  # another platform: left alone
    layout.point(other, old_blob)
    layout.remember(here, layout.Pointer(pointer=str(other), repository=REPO, tag=TAG, platform="linux/arm64",
                                         digest=OLD, sha256=old_sha))
    new_blob, new_sha = kept(two, b"new image")
    new_blob.write_bytes(b"changed after it was kept")
    new = move(new_blob, layout.pointer_path(two, REPO, "demo", TAG, "linux/amd64"), new_sha)
    assert not layout.flip(new, REPO, NEW, "linux/amd64", here, check=True)  # its sha256 is not its name
    assert not Path(new.pointer).exists() and layout.target(Path(old.pointer)) == old_blob
    new_blob.write_bytes(b"new image")
    assert layout.flip(new, REPO, NEW, "linux/amd64", here, check=True)
    # the SHA tag serves the new digest: the old image's pointer in the other directory goes; arm64's stays
    assert layout.target(Path(new.pointer)) == new_blob and not os.path.lexists(old.pointer)
    assert layout.target(other) == old_blob
    assert {(r.pointer, r.digest) for r in layout.records(here)} == {(new.pointer, NEW), (str(other), OLD)}
    # a publish of a third digest with no .sqsh: the amd64 pointer names another image's file, so it goes
    assert layout.follow(here, REPO, TAG, "linux/amd64", "sha256:" + "3" * 64) == [new.pointer]


def test_gc_keeps_what_a_pointer_names_and_frees_the_rest_after_the_age(tmp_path: Path) -> None:
    """Planted: gc without the pointer check frees the named file too."""
    here = settings(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    named, sha = kept(shared, b"served")
    stale, _ = kept(shared, b"superseded")
    young, _ = kept(shared, b"just kept by a publish")
    week = time.time() - 8 * 86400
    for path in (named, stale):
        os.utime(path, (week, week))
    pointer = layout.pointer_path(shared, REPO, "demo", TAG, "linux/amd64")
    assert layout.flip(move(named, pointer, sha), REPO, NEW, "linux/amd64", here, check=False)
    freed = gc.Freed()
    gc.sqsh_files(here, time.time() - gc.WEEK_S, freed)
    assert freed.removed == {".sqsh": [str(stale)]}
    assert sorted(p.name for p in shared.iterdir()) == sorted(
        [pointer.name, named.name, named.name + ".sha256", young.name, young.name + ".sha256"])
    pointer.unlink()  # removed by hand: its record goes, the file once it is old
    gc.sqsh_files(here, time.time(), gc.Freed())
    assert layout.records(here) == [] and not named.exists()
