"""builder/release/multiarch.py without a registry: the set of per-platform reports is one release or refused in
one line (exit 2), and the index and its record say each member's gates."""
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.core.errors import BadInput
from builder.core.records import GateStatus
from builder.engine.platforms import Platform
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.release import multiarch, referrers, sqsh
from builder.report import document as report
from tests.fixture_types import MakeReportInputs


def member(report_inputs: MakeReportInputs, tmp_path: Path, platform: str, required: list[str] | None = None,
           built_for: dict[str, str] | None = None, **kwargs: Any) -> multiarch.Member:
    """One platform's ACCEPTED report (its pins file and lock on disk, as publish re-reads them), its lock made for
    its own base and commits (or `built_for`). `required`: the pins require only these gates (no performance
    section); the others read not_run, as on an emulated member."""
    statuses: dict[str, GateStatus | None] | None = None
    if required:
        statuses = {g: "not_run" for g in ("zero_update", "rl_step", "control", "performance") if g not in required}
    pins, sources, built, acceptance = report_inputs(platform=platform, required=required, statuses=statuses,
                                                     **kwargs)
    if required and "performance" not in required:  # pins naming acceptance.performance require it
        data = yaml.safe_load(pins.path.read_text())
        data["acceptance"].pop("performance", None)
        pins.path.write_text(yaml.safe_dump(data, sort_keys=False))
        pins = pins_mod.load(pins.path)
        sources = sources.model_copy(update={"pins_sha256": pins.sha256})
    lock_text = pins.lock_path().read_text()
    want = built_for or {"base": pins.base.digest, **multiarch._commits(pins)}
    line = lock_record.FOR_MARK + " ".join(f"{k}={v}" for k, v in want.items())
    pins.lock_path().write_text("\n".join(line if ln.startswith(lock_record.FOR_MARK) else ln
                                          for ln in lock_text.split("\n")))
    lock = lock_record.of(pins)
    assert lock.built_for == want
    rep = report.make_report(pins, lock, sources, built, acceptance)
    assert rep.verdict == "ACCEPTED"
    out = tmp_path / platform.replace("/", "-")
    return multiarch.Member(report.write(rep, out)["json"], rep, pins, lock)


def test_a_set_of_two_platforms_of_one_release_is_accepted(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    amd = member(report_inputs, tmp_path, "linux/amd64")
    arm = member(report_inputs, tmp_path, "linux/arm64", required=["provenance"])
    multiarch.check_set([amd, arm])
    assert arm.platform == Platform("linux", "arm64", "v8")


def test_one_report_is_not_an_index(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="needs two reports of different platforms"):
        multiarch.check_set([member(report_inputs, tmp_path, "linux/amd64")])


def test_two_reports_of_one_platform_are_refused(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    one = member(report_inputs, tmp_path, "linux/arm64")
    two = member(report_inputs, tmp_path / "b", "linux/arm64")
    with pytest.raises(BadInput, match=r"platform linux/arm64/v8 again \(also .*\); one report per platform"):
        multiarch.check_set([one, two])


def test_other_commits_are_refused(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    amd = member(report_inputs, tmp_path, "linux/amd64")
    arm = member(report_inputs, tmp_path, "linux/arm64")
    comps = dict(arm.pins.components.items())
    comps["verl"] = comps["verl"].model_copy(update={"commit": "f" * 40})
    moved = dataclasses.replace(arm, pins=arm.pins.model_copy(update={"components": arm.pins.components.model_copy(
        update={"verl": comps["verl"]})}))
    with pytest.raises(BadInput, match=r"components\.verl\.commit is f{40}, .* has ") as err:  # a long path clips it
        multiarch.check_set([amd, moved])
    assert "\n" not in str(err.value)


def test_other_build_inputs_are_refused(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    amd = member(report_inputs, tmp_path, "linux/amd64")
    arm = member(report_inputs, tmp_path, "linux/arm64")
    vllm = arm.pins.components["vllm"]
    other = vllm.model_copy(update={"install": vllm.install.model_copy(update={"env": {"EXTRA": "1"}})})
    changed = dataclasses.replace(arm, pins=arm.pins.model_copy(update={"components": arm.pins.components.model_copy(
        update={"vllm": other})}))
    with pytest.raises(BadInput, match=r"components\.vllm\.install differs from .*same pins' requirements"):
        multiarch.check_set([amd, changed])


def test_a_lock_not_made_for_its_platform_is_refused(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    amd = member(report_inputs, tmp_path, "linux/amd64")
    # the arm64 member's lock was made for the amd64 member's base (another digest)
    arm = member(report_inputs, tmp_path, "linux/arm64", built_for={"base": "sha256:" + "ee" * 32,
                                                                     **multiarch._commits(amd.pins)})
    with pytest.raises(BadInput, match=r"demo\.lock: the lock of .* made for base=sha256:e{64}, not for its platform "
                                       r"linux/arm64/v8 \(base sha256:cdcd"):
        multiarch.check_set([amd, arm])


def test_the_index_holds_exactly_the_members_with_their_gates(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    amd = member(report_inputs, tmp_path, "linux/amd64")
    arm = member(report_inputs, tmp_path, "linux/arm64", required=["provenance"])
    bodies = [b'{"schemaVersion":2,"a":1}', b'{"schemaVersion":2,"b":2}']
    records = [multiarch.member_record(m, "sha256:" + c * 64) for m, c in zip((amd, arm), "12")]
    entries = [multiarch.descriptor(b, referrers.OCI_MANIFEST, m.platform, r)
               for b, m, r in zip(bodies, (amd, arm), records)]
    doc = json.loads(multiarch.index_body(entries))
    assert doc["mediaType"] == "application/vnd.oci.image.index.v1+json" and doc["schemaVersion"] == 2
    assert [(e["size"], e["platform"]) for e in doc["manifests"]] == [
        (len(bodies[0]), {"os": "linux", "architecture": "amd64"}),
        (len(bodies[1]), {"os": "linux", "architecture": "arm64", "variant": "v8"})]
    assert records[0]["accepted_on"] == ["provenance", "zero_update", "rl_step", "control", "performance"][
        :len(records[0]["accepted_on"])] and records[0]["not_required"] == []
    # the emulated member: accepted on provenance only, every other gate shown with its status
    assert records[1]["accepted_on"] == ["provenance"]
    assert {g["gate"]: g["status"] for g in records[1]["not_required"]} == {
        "zero_update": "not_run", "rl_step": "not_run", "control": "not_run", "performance": "not_run"}
    assert doc["manifests"][1]["annotations"] == {"dev.rl-image-builder.accepted-on": "provenance",
                                                  "dev.rl-image-builder.not-required":
                                                      "zero_update,rl_step,control,performance"}


def test_each_platforms_exported_sqsh_name_says_its_platform(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    amd = member(report_inputs, tmp_path, "linux/amd64")
    arm = member(report_inputs, tmp_path, "linux/arm64", required=["provenance"])
    names = [sqsh.default_out(m.report, m.path).name for m in (amd, arm)]
    tag = amd.report.tags[0]
    assert names[0].endswith(f"+{tag}.linux-amd64.sqsh") and names[1].endswith(f"+{tag}.linux-arm64.sqsh")
    assert sqsh.default_out(amd.report, amd.path).parent == amd.path.parent
