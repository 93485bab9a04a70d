"""builder publish of several per-platform reports into one OCI index, against the local registry (127.0.0.1:5000):
two tiny local images (amd64; arm64/v8 with a static aarch64 executable), each with an ACCEPTED report whose pins
and lock publish re-reads; the arm64 one is accepted on provenance only (the emulated member). A few seconds."""
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder import cli
from builder.core.constants import LABEL_PREFIX
from builder.core.errors import AttestationError, BadInput
from builder.core.imageref import digest_of
from builder.engine import client as engine
from builder.engine.registry import Registry
from builder.pipeline import releasing
from builder.release import attest, dsse, multiarch, referrers
from builder.report import document as report
from tests.conftest import SETTINGS
from tests.fixture_types import DockerClient, MakeReportInputs
from tests.integration.test_multiarch_base import aarch64_exit_elf
from tests.unit.test_multiarch import member

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


COMMITS = {name: hashlib.sha1(name.encode()).hexdigest() for name in ("vllm", "megatron", "verl")}  # report_inputs'
DISTS = {"vllm": "tinyengine", "megatron": "tinycore", "verl": "tinyrl"}
DELIVERY = json.dumps({  # the delivery manifest attest and verify read from the layers
    "components": {n: {"commit": c, "tree": hashlib.sha1(f"tree{n}".encode()).hexdigest(), "distribution": DISTS[n],
                       "version": "0.1.0"} for n, c in COMMITS.items()},
    "distributions": {d: "0.1.0" for d in DISTS.values()}}).encode()


def _layer(name: str, data: bytes, mode: int) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path, body, bits in ((name, data, mode), ("opt/delivery/manifest.json", DELIVERY, 0o644)):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(body), bits, 0
            tar.addfile(info, io.BytesIO(body))
    return raw.getvalue()


def load_image(client: DockerClient, tag: str, layer: bytes, platform: dict[str, str]) -> str:
    """A one-layer image of that platform, loaded as `docker save` writes it (import would say amd64); its ID."""
    labels = {f"{LABEL_PREFIX}.{n}.commit": c for n, c in COMMITS.items()}
    config = json.dumps({**platform, "config": {"Cmd": ["/bin/true"], "Labels": labels},
                         "rootfs": {"type": "layers", "diff_ids": [digest_of(layer)]}}).encode()
    name = hashlib.sha256(config).hexdigest() + ".json"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, data in ((name, config), ("layer/layer.tar", layer), ("manifest.json", json.dumps(
                [{"Config": name, "RepoTags": [tag], "Layers": ["layer/layer.tar"]}]).encode())):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    client.images.load(out.getvalue())
    return str(client.images.get(tag).id)


@pytest.fixture(scope="module")
def platform_images(docker_client: DockerClient) -> Iterator[dict[str, str]]:
    """{platform: image ID} of the two members; removed at the end."""
    ids = {"linux/amd64": load_image(docker_client, "builder-tests/multiarch:amd64",
                                     _layer("hello.txt", b"amd64 member\n", 0o644),
                                     {"architecture": "amd64", "os": "linux"}),
           "linux/arm64": load_image(docker_client, "builder-tests/multiarch:arm64",
                                     _layer("bin/true", aarch64_exit_elf(), 0o755),
                                     {"architecture": "arm64", "variant": "v8", "os": "linux"})}
    yield ids
    for image_id in ids.values():
        engine.remove_image(docker_client, image_id, force=True)  # False when already gone


def test_two_accepted_platforms_publish_one_index(report_inputs: MakeReportInputs, tmp_path: Path,
                                                  platform_images: dict[str, str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    repo = f"127.0.0.1:5000/tests/multiarch-{uuid.uuid4().hex[:8]}"
    amd = member(report_inputs, tmp_path, "linux/amd64", repository=repo, image_id=platform_images["linux/amd64"])
    arm = member(report_inputs, tmp_path, "linux/arm64", required=["provenance"], repository=repo,
                 image_id=platform_images["linux/arm64"])
    reg, name = Registry("127.0.0.1:5000"), repo.split("/", 1)[1]
    # refused before anything is published: the same report twice is one platform twice (exit 2, one line)
    assert cli.run(["publish", str(arm.path), str(arm.path)]) == 2
    line = capsys.readouterr().err.strip().splitlines()
    assert len(line) == 1 and "platform linux/arm64/v8 again" in line[0] and "one report per platform" in line[0]
    assert reg.tag_digest(name, "demo") is None and reg.tag_digest(name, amd.report.tags[0]) is None
    at = releasing.publish_index([amd.path, arm.path], SETTINGS)
    digest = at.split("@")[1]
    index = json.loads(reg.manifest_by_digest(name, digest))
    assert index["mediaType"] == referrers.OCI_INDEX
    reports = {m.platform: report.load(m.path) for m in (amd, arm)}
    # exactly the accepted members, by the digests their receipts name, with their platforms and gates
    assert [(e["digest"], e["platform"]) for e in index["manifests"]] == [
        (reports[amd.platform].publish.digest, {"os": "linux", "architecture": "amd64"}),  # type: ignore[union-attr]
        (reports[arm.platform].publish.digest, {"os": "linux", "architecture": "arm64", "variant": "v8"})]  # type: ignore[union-attr]
    assert index["manifests"][1]["annotations"]["dev.rl-image-builder.accepted-on"] == "provenance"
    for tag in amd.report.tags:  # the SHA tag and demo serve the index
        assert reg.tag_digest(name, tag) == digest
    for m in (amd, arm):  # each platform's report names the index, in report.json and report.md
        rep = reports[m.platform]
        assert rep.publish is not None and rep.publish.index == at and rep.publish.platform == m.report.platform
        assert f"| Published in index | `{at}` |" in (m.path.parent / "report.md").read_text()
        record = json.loads((m.path.parent / multiarch.RECORD_FILE).read_text())
        assert record["index"] == at
    arm_rec = record["members"][1]
    assert arm_rec["accepted_on"] == ["provenance"] and {g["gate"] for g in arm_rec["not_required"]} == {
        "zero_update", "rl_step", "control", "performance"}
    # verify --platform: a missing platform names those the index has; a member digest is not an index
    with pytest.raises(BadInput, match=r"--platform: the index .* has no linux/ppc64le entry \(it has linux/amd64, "
                                       r"linux/arm64/v8\)"):
        multiarch.verify_platform(at, "linux/ppc64le", [], SETTINGS)
    member_ref = f"{repo}@{index['manifests'][0]['digest']}"
    with pytest.raises(BadInput, match="is one image .*not an index; verify it without --platform"):
        multiarch.verify_platform(member_ref, "linux/amd64", [], SETTINGS)
    with pytest.raises(AttestationError, match="no record of .* signed by a trusted key"):
        multiarch.verify_platform(at, "linux/arm64", [], SETTINGS)  # published without a key: no signed record


def test_a_signed_index_verifies_each_member_against_its_own_acceptance(
        report_inputs: MakeReportInputs, tmp_path: Path, platform_images: dict[str, str]) -> None:
    """With a key: each member's three attestations and the index's signed record; `builder verify --platform`
    checks the arm64 member and says it was accepted on provenance only."""
    repo = f"127.0.0.1:5000/tests/multiarch-{uuid.uuid4().hex[:8]}"
    key, pub = tmp_path / "key.pem", tmp_path / "key.pub"
    dsse.keygen(key, pub)
    members = [member(report_inputs, tmp_path, "linux/amd64", repository=repo, image_id=platform_images["linux/amd64"]),
               member(report_inputs, tmp_path, "linux/arm64", required=["provenance"], repository=repo,
                      image_id=platform_images["linux/arm64"])]
    for m in members:
        attest.sign_acceptance(m.report, m.pins, dsse.load_private(key), m.path.parent)
    at = releasing.publish_index([m.path for m in members], SETTINGS, key=key)
    out = releasing.verify(at.split("@")[0] + ":demo", [pub], SETTINGS, platform="linux/arm64")
    arm = report.load(members[1].path).publish
    assert arm is not None and out.reference == f"{repo}@{arm.digest}"
    assert out.passed[0].endswith(f"its linux/arm64 member is {arm.digest}")
    assert "test result: PASSED (1)" in out.passed
    assert out.passed[-1].startswith("member gates: accepted on provenance (its own signed test result); "
                                     "not required: zero_update not_run")
    full = releasing.verify(at, [pub], SETTINGS, platform="linux/amd64").passed[-1]
    assert full.startswith("member gates: accepted on provenance, ") and full.endswith("; every gate")
    # planted: an index whose signed record says the arm64 member also passed rl_step; its own test result did not
    reg, name = Registry("127.0.0.1:5000"), repo.split("/", 1)[1]
    index = json.loads(reg.manifest_by_digest(name, at.split("@")[1]))
    index["annotations"] = {"forged": "1"}
    body = json.dumps(index).encode()
    forged = digest_of(body)
    reg.put_manifest(name, forged, body, referrers.OCI_INDEX)
    record = json.loads((members[1].path.parent / multiarch.RECORD_FILE).read_text())["members"]
    record[1]["accepted_on"] = ["provenance", "rl_step"]
    envelope = json.dumps(dsse.sign(multiarch.record_statement(repo, forged, record), dsse.load_private(key))).encode()
    referrers.attach(reg, name, {"mediaType": referrers.OCI_INDEX, "digest": forged, "size": len(body)}, envelope,
                     multiarch.RECORD_TYPE)
    with pytest.raises(AttestationError, match=r"the record says rl_step passed; .*'s signed test result passed "
                                               r"provenance$"):
        multiarch.verify_platform(f"{repo}@{forged}", "linux/arm64", [dsse.load_public(pub)], SETTINGS)
    other = tmp_path / "other.pub"
    dsse.keygen(tmp_path / "other.pem", other)
    with pytest.raises(AttestationError, match="no record of .* signed by a trusted key"):
        multiarch.verify_platform(at, "linux/arm64", [dsse.load_public(other)], SETTINGS)


def publish_killed_at(members: list[multiarch.Member], failpoint: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """`builder publish` of the members, held at the fail point and SIGKILLed there; the argv and the environment
    (no fail point) for the command that recovers."""
    argv = [sys.executable, "-m", "builder", "publish", *(str(m.path) for m in members)]
    hold = tmp_path / "hold"
    hold.touch()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("BUILDER_FAILPOINT")}, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, cwd=ROOT, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**env, "BUILDER_FAILPOINT": failpoint, "BUILDER_FAILPOINT_HOLD": str(hold)})
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith(f"failpoint {failpoint}"):
            break
    else:
        pytest.fail("never reached the fail point: " + "".join(seen[-10:]))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    hold.unlink()
    return argv, env


def test_a_killed_index_publish_is_finished_by_the_next(report_inputs: MakeReportInputs, tmp_path: Path,
                                                         platform_images: dict[str, str]) -> None:
    """SIGKILL after the tags moved onto the index, before the receipts: the next publish reads the journal,
    finishes the tags and writes each member's receipt naming the index (from the record beside the report)."""
    repo = f"127.0.0.1:5000/tests/multiarch-{uuid.uuid4().hex[:8]}"
    members = [member(report_inputs, tmp_path, "linux/amd64", repository=repo, image_id=platform_images["linux/amd64"]),
               member(report_inputs, tmp_path, "linux/arm64", required=["provenance"], repository=repo,
                      image_id=platform_images["linux/arm64"])]
    argv, env = publish_killed_at(members, "publish index: receipt", tmp_path)
    assert all(report.load(m.path).publish is None for m in members)  # killed before any receipt
    rerun = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    at = json.loads(rerun.stdout)["index"]
    assert f"finished the publish of {at} that a killed run began: tags " in rerun.stderr
    assert ", receipt" in rerun.stderr.split("finished the publish", 1)[1].splitlines()[0]
    for m in members:
        got = report.load(m.path).publish
        assert got is not None and got.index == at
