"""`make demo-arm64`'s member pins (demo/arm64.py): the demo pins for another platform are one release with the
demo's (the index publish refuses any other build input), and the arm64 member requires provenance only, the gate
emulation can run."""
from __future__ import annotations

from pathlib import Path

import yaml

from builder.pins import model
from builder.release import multiarch
from demo import arm64

ROOT = Path(__file__).resolve().parents[2]
BASE = "127.0.0.1:5000/demo/base@sha256:" + "a" * 64


def member(arch: str, where: Path) -> model.Pins:
    """The member's pins in `where`, beside a copy of the demo lock under the member's lock path."""
    data = yaml.safe_load((ROOT / "pins" / "demo.yaml").read_text())
    arm64.member_edit(data, arch, BASE)
    (where / "locks").mkdir()
    (where / data["build"]["lock"]).write_text((ROOT / "pins" / "locks" / "demo.lock").read_text())
    return model.validate(data, where)


def test_the_arm64_member_is_the_demo_release_on_provenance_only(tmp_path: Path) -> None:
    demo, arm = model.load(ROOT / "pins" / "demo.yaml"), member("arm64", tmp_path)
    assert arm.base.platform == "linux/arm64" and arm.base.digest == "sha256:" + "a" * 64
    assert list(arm.acceptance.required_gates) == ["provenance"] and arm.acceptance.performance is None
    assert multiarch._commits(arm) == multiarch._commits(demo) and multiarch._inputs(arm) == multiarch._inputs(demo)
    assert (arm.image.repository, arm.image.tags) == (demo.image.repository, demo.image.tags)


def test_the_amd64_member_keeps_every_gate(tmp_path: Path) -> None:
    demo, amd = model.load(ROOT / "pins" / "demo.yaml"), member("amd64", tmp_path)
    assert amd.acceptance.required_gates == demo.acceptance.required_gates and amd.acceptance.performance is not None
    assert multiarch._inputs(amd) == multiarch._inputs(demo)
