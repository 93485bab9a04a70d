"""Normalisation of layers and config, without Docker: same content -> same bytes, whatever the
build's times, member order or owner names; per-build config fields dropped; the rebuild diff names files."""
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from builder.engine import normalize
from builder.release import rebuild

EPOCH = 1735912800  # 2025-01-03T14:00:00Z


def layer(path: Path, entries: list[tuple[str, str, bytes]], mtime: int, uname: str = "builder") -> Path:
    """A layer tar: entries are (name, kind, data) with kind 'dir', 'file' or 'link:<target>'."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.uname, info.gname = mtime, uname, uname
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind.startswith("link:"):
                info.type, info.linkname = tarfile.LNKTYPE, kind[5:]
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return path


def normalised(path: Path) -> tuple[str, bytes]:
    out = io.BytesIO()
    diff_id, _ = normalize.normalize_layer(path, out, EPOCH)
    return diff_id, out.getvalue()


ENTRIES = [("opt", "dir", b""), ("opt/a", "dir", b""), ("opt/a/x.py", "file", b"print(1)\n"),
           ("opt/a/y.txt", "file", b"y"), ("opt/b", "link:opt/a/y.txt", b"")]


def test_same_content_different_times_order_owner_gives_same_bytes(tmp_path: Path) -> None:
    first = layer(tmp_path / "1.tar", ENTRIES, mtime=2_000_000_000)
    # another build: later mtimes, another owner name, the hard link's data on the other name
    second = layer(tmp_path / "2.tar", [ENTRIES[0], ("opt/b", "file", b"y"), ENTRIES[1], ENTRIES[2],
                                        ("opt/a/y.txt", "link:opt/b", b"")],
                   mtime=2_000_123_456, uname="root")
    a, b = normalised(first), normalised(second)
    assert a == b
    # gzip header: no name, mtime 0
    assert a[1][:8] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00"  # no file name flag, mtime 0
    with tarfile.open(fileobj=gzip.GzipFile(fileobj=io.BytesIO(a[1]))) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["opt", "opt/a", "opt/a/x.py", "opt/a/y.txt", "opt/b"]
    assert all(m.mtime == EPOCH and m.uname == "" for m in members)
    assert members[3].isreg() and members[4].islnk() and members[4].linkname == "opt/a/y.txt"
    assert a[0] == "sha256:" + hashlib.sha256(gzip.decompress(a[1])).hexdigest()


def test_older_mtimes_are_kept_and_content_change_shows(tmp_path: Path) -> None:
    old = layer(tmp_path / "old.tar", ENTRIES, mtime=946684800)
    with tarfile.open(fileobj=gzip.GzipFile(fileobj=io.BytesIO(normalised(old)[1]))) as tar:
        assert {m.mtime for m in tar.getmembers()} == {946684800}
    changed = layer(tmp_path / "c.tar", ENTRIES[:2] + [("opt/a/x.py", "file", b"print(2)\n")] + ENTRIES[3:],
                    mtime=2_000_000_000)
    assert normalised(changed)[0] != normalised(layer(tmp_path / "s.tar", ENTRIES, mtime=2_000_000_000))[0]


def test_config_loses_everything_per_build() -> None:
    raw = {"architecture": "amd64", "os": "linux", "created": "2026-11-29T22:44:37.6Z", "docker_version": "20.10",
           "container": "70e4fa1b", "container_config": {"Hostname": "70e4fa1b"},
           "config": {"Image": "sha256:d35c", "Hostname": "", "Labels": {"a": "b"}},
           "rootfs": {"type": "layers", "diff_ids": ["sha256:1", "sha256:x"]},
           "history": [{"created": "2024-01-01T00:00:00Z", "created_by": "base"},
                       {"created": "2026-11-29T22:44:33Z", "created_by": "RUN x"}]}
    config = json.loads(normalize.fixed_config(raw, 1, ["sha256:1", "sha256:2"], EPOCH))
    assert not {"container", "container_config", "docker_version"} & set(config)
    assert config["created"] == "2025-01-03T14:00:00Z" and config["config"]["Image"] == ""
    assert [h["created"] for h in config["history"]] == ["2024-01-01T00:00:00Z", "2025-01-03T14:00:00Z"]
    assert config["rootfs"]["diff_ids"] == ["sha256:1", "sha256:2"] and config["config"]["Labels"] == {"a": "b"}


def test_rebuild_diff_names_the_stamped_file(tmp_path: Path) -> None:
    a = normalised(layer(tmp_path / "a.tar", ENTRIES + [("opt/a/BUILD_TIME", "file", b"1764456000")], 2_000_000_000))
    b = normalised(layer(tmp_path / "b.tar", ENTRIES + [("opt/a/BUILD_TIME", "file", b"1764456123")], 2_000_000_000))
    entries = rebuild.diff_listings(rebuild.listing(a[1]), rebuild.listing(b[1]))
    assert [e["path"] for e in entries] == ["/opt/a/BUILD_TIME"]
    assert set(entries[0]["fields"]) == {"sha256"}
    without = normalised(layer(tmp_path / "c.tar", ENTRIES, 2_000_000_000))
    gone = rebuild.diff_listings(rebuild.listing(a[1]), rebuild.listing(without[1]))
    assert gone[0]["path"] == "/opt/a/BUILD_TIME" and gone[0]["change"] == "removed"


def test_rebuild_check_takes_the_digest_from_any_report_that_names_it(tmp_path: Path) -> None:
    from builder.core.errors import BadInput
    from builder.core.imageref import ImageRef
    from builder.core.records import AcceptanceResult, BuiltImage, Pulled, Report

    manifest, image_id = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    ref = ImageRef("127.0.0.1:5000/x-staging@" + manifest)
    built = BuiltImage.model_construct(manifest_digest=manifest, staged=ref)
    accepted_image = AcceptanceResult.model_construct(pulled=Pulled(ref=ref, digest=manifest, image_id=image_id))
    local_only = AcceptanceResult.model_construct(pulled=None)
    cases = [Report.model_construct(build=built, acceptance=None, image_id=image_id),   # builder run
             Report.model_construct(build=None, acceptance=accepted_image, image_id=image_id)]  # accept --image
    for rep in cases:
        assert rebuild.expected(rep, tmp_path / "r.json") == (manifest, image_id, ref)
    by_id = Report.model_construct(build=None, acceptance=local_only, image_id=image_id)
    assert rebuild.expected(by_id, tmp_path / "r.json") == ("", image_id, "")
    same = rebuild.compare(by_id, manifest, image_id, None)  # type: ignore[arg-type]
    assert same["status"] == "same"
    assert rebuild.compare(by_id, manifest, "sha256:" + "c" * 64, None)["status"] == "different"  # type: ignore[arg-type]
    nothing = Report.model_construct(build=None, acceptance=None, image_id="unknown")
    with pytest.raises(BadInput, match="expected a report naming the image digest"):
        rebuild.expected(nothing, tmp_path / "r.json")
