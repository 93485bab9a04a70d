"""`publish` of a cluster-accepted report (the good run of the session's nightly fleet, conftest: slurm_fleet):
the registry digest is promoted and the .sqsh the gates ran on is placed, kept by its sha256 with its .sha256, and
named by a pointer per platform under the SHA tag. Refused, with nothing published (no release tag, no .sqsh), when
the file being published is not the one accepted, or when its export record names another sha256 or another image
than the registry digest serves."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from builder.core import files as fs
from builder.core.errors import PublishError
from builder.core.options import Settings
from builder.engine.registry import Registry, split_repository
from builder.pipeline import releasing
from builder.report import document

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]
SETTINGS = Settings.from_env()


def copy_run(run_dir: Path, dest: Path) -> Path:
    """The run directory copied, so each test publishes (or is refused) from a report of its own."""
    shutil.copytree(run_dir, dest)
    return dest / "report.json"


def nothing_published(report_json: Path, published: Path) -> None:
    report = document.load(report_json)
    host, name = split_repository(report.repository)
    assert all(Registry(host).tag_digest(name, tag) is None for tag in report.tags)
    assert report.publish is None and report.sqsh is None
    assert not published.exists() or list(published.iterdir()) == []  # no .sqsh, no part file


def tampered(report_json: Path, where: Path, change: str) -> None:
    """Point the report at a copy of its .sqsh (and export record) in `where`, changed as `change` says."""
    data = json.loads(report_json.read_text())
    src = Path(data["acceptance"]["where"]["sqsh"]["path"])
    where.mkdir()
    copy = where / src.name
    record = json.loads(src.with_name(src.name + ".json").read_text())
    if change == "file":
        shutil.copyfile(src, copy)
        with open(copy, "r+b") as fh:  # one byte in the last block
            fh.seek(-1, os.SEEK_END)
            last = fh.read(1)
            fh.seek(-1, os.SEEK_END)
            fh.write(bytes([last[0] ^ 1]))
    else:
        os.link(src, copy)  # the same bytes; only the record differs
        if change == "record-sha256":
            record["sha256"] = "0" * 64
        else:
            record["image_id"] = "sha256:" + "0" * 64
    (where / (src.name + ".json")).write_text(json.dumps(record))
    data["acceptance"]["where"]["sqsh"]["path"] = str(copy)
    report_json.write_text(json.dumps(data, indent=2))


@pytest.mark.parametrize("change, words", [
    ("file", "the .sqsh being published"),
    ("record-sha256", "says sha256 0000000000000000"),
    ("record-image", "is of image sha256:000000000000"),
])
def test_publish_refuses_a_sqsh_other_than_the_accepted(slurm_fleet: dict[str, Any], tmp_path: Path, change: str,
                                                        words: str) -> None:
    report_json = copy_run(slurm_fleet["runs"]["a"], tmp_path / "run")
    tampered(report_json, tmp_path / "shared", change)
    published = tmp_path / "published"
    published.mkdir()
    with pytest.raises(PublishError, match="refusing") as err:
        releasing.publish_report(report_json, SETTINGS, sqsh_dir=published)
    assert words in str(err.value), str(err.value)
    nothing_published(report_json, published)


def test_publish_promotes_the_digest_and_places_the_sqsh_under_the_sha_tag(slurm_fleet: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    accepted = json.loads((slurm_fleet["runs"]["a"] / "report.json").read_text())["acceptance"]["where"]["sqsh"]
    report_json = copy_run(slurm_fleet["runs"]["a"], tmp_path / "run")
    published = tmp_path / "published"
    published.mkdir()
    receipt = releasing.publish_report(report_json, SETTINGS, sqsh_dir=published)
    report = document.load(report_json)
    sha_tag = report.tags[0]
    host, name = split_repository(report.repository)
    assert all(Registry(host).tag_digest(name, tag) == receipt.digest for tag in report.tags)
    assert receipt.digest == report.build.manifest_digest if report.build else False
    pointer = published / f"{report.repository.partition('/')[2].replace('/', '+')}+{sha_tag}.linux-amd64.sqsh"
    dest = published / f"sha256-{accepted['sha256']}.sqsh"  # kept by its sha256; the pointer under the SHA tag
    assert sorted(p.name for p in published.iterdir()) == sorted([pointer.name, dest.name, dest.name + ".sha256"])
    assert os.readlink(pointer) == dest.name and fs.sha256_file(dest) == accepted["sha256"]
    assert (published / (dest.name + ".sha256")).read_text() == f"{accepted['sha256']}  {dest.name}\n"
    assert report.sqsh is not None and report.sqsh.path == str(dest) and report.sqsh.tag == sha_tag
    assert report.sqsh.pointer == str(pointer)
    assert report.sqsh.registry_digest == receipt.digest and report.sqsh.sha256 == accepted["sha256"]
    assert receipt.digest in (report_json.parent / "report.md").read_text()
