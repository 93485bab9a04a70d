"""The lock binding end to end (issue 34, item 7): a real accepted run of the demo image, its lock edited after
the run, then `builder publish` through the CLI with a signing key is refused (exit 2, one line naming the lock),
the release tag is left where it was (read back from the registry), and nothing is signed: no attestation in the
registry, no receipt in the report. The same run, with its lock put back, publishes and is signed."""
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.engine.registry import Registry, split_repository
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.release import attest, dsse, referrers
from builder.report import document as report_mod
from demo.prepare import variant_pins
from tests.fixture_types import DemoAccepted

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
RELEASE = "127.0.0.1:5000/tests-lock-edit/unified"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "BUILDER_SIGNING_KEY"})


@pytest.fixture
def release() -> Iterator[tuple[Registry, str]]:
    """This test's own release repository: (registry, repository name); emptied at the end."""
    host, name = split_repository(RELEASE)
    reg = Registry(host)
    yield reg, name
    for tag in reg.tags(name):
        digest = reg.tag_digest(name, tag)
        if digest:
            for desc in referrers.discover(reg, name, digest):
                reg.delete_manifest(name, desc["digest"])
            reg.delete_manifest(name, digest)


def put_base_under(reg: Registry, name: str, tag: str, base_image: str) -> str:
    """The release tag where it was before this run: the base image's manifest (blobs mounted); its digest."""
    base_repo, _, digest = base_image.partition("@")
    base_name = split_repository(base_repo)[1]
    body = reg.manifest_by_digest(base_name, digest)
    doc = json.loads(body)
    for desc in [*doc["layers"], doc["config"]]:
        assert reg.has_blob(name, desc["digest"]) or reg.mount_blob(name, desc["digest"], base_name)
    return reg.put_manifest(name, tag, body, doc["mediaType"])


def test_a_lock_edited_after_the_run_is_refused_at_publish(demo_accepted: DemoAccepted, tmp_path: Path,
                                                           release: tuple[Registry, str]) -> None:
    pins, resolved, built, result = demo_accepted
    reg, name = release
    tag = f"t{time.time_ns()}"

    def own_release(data: dict[str, Any]) -> None:  # this test's repository and tag, in a pins file publish re-reads
        data["image"].update(repository=RELEASE, tags=[tag])

    run_pins = pins_mod.load(variant_pins(tmp_path / "pins", edit=own_release, pins_path=pins.path))
    lock = lock_record.of(run_pins)
    sources = resolved.model_copy(update={"pins_path": str(run_pins.path), "pins_sha256": run_pins.sha256})
    rep = report_mod.make_report(run_pins, lock, sources, built, result)
    assert rep.verdict == "ACCEPTED", rep.reasons
    assert rep.lock_sha256 == lock.sha256
    run_dir = tmp_path / "run"
    report_json = report_mod.write(rep, run_dir)["json"]
    dsse.keygen(tmp_path / "key.pem", tmp_path / "key.pub")
    attest.sign_acceptance(rep, run_pins, dsse.load_private(tmp_path / "key.pem"), run_dir)
    before = put_base_under(reg, name, tag, run_pins.base.image)
    files = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*"))

    # the lock edited after the run: one wheel's hash changed (it still parses; only its bytes differ)
    text = lock.path.read_text()
    edited = re.sub(r"--hash=sha256:([0-9a-f])", lambda m: "--hash=sha256:" + "0123456789abcdef"[
        (int(m.group(1), 16) + 1) % 16], text, count=1)
    assert edited != text
    lock.path.write_text(edited)
    refused = cli("publish", str(report_json), "--key", str(tmp_path / "key.pem"))
    assert refused.returncode == 2, refused.stderr
    lines = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith("error: ") and ": lock_sha256: " in lines[0], lines[0]
    assert lines[0].endswith("now has sha256 " + lock_record.of(run_pins).sha256[:16]
                             + "..., not the one the report recorded; refusing to publish"), lines[0]
    # the tag is where it was; the accepted digest is not in the repository; nothing signed, nothing recorded
    assert reg.tag_digest(name, tag) == before
    assert reg.tag_digest(name, built.manifest_digest) is None
    assert referrers.discover(reg, name, before) == []
    assert reg.tag_digest(name, referrers.fallback_tag(built.manifest_digest)) is None
    assert report_mod.load(report_json).publish is None
    assert sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")) == files

    # the lock put back: the same run publishes, the tag moves to the accepted digest, and it is signed
    lock.path.write_text(text)
    published = cli("publish", str(report_json), "--key", str(tmp_path / "key.pem"))
    assert published.returncode == 0, published.stderr
    receipt = report_mod.load(report_json).publish
    assert receipt is not None and receipt.attestations
    assert reg.tag_digest(name, tag) == receipt.digest != before
    assert referrers.discover(reg, name, receipt.digest)
