"""A multi-arch index of cluster-accepted members places each member's .sqsh (builder/release/multiarch.py): kept by
its sha256, named by a pointer per platform under the SHA tag that follows the member's digest, journaled like the
single-image publish. The two tiny members of test_multiarch_publish, staged by digest, with a stand-in .sqsh each
(placement moves and hashes bytes; test_cluster_publish places a real one). A few seconds."""
import hashlib
import subprocess
import uuid
from pathlib import Path

import pytest

from builder.core.imageref import ImageRef
from builder.core.records import EngineFacts, NodeFacts, Pulled, RunnerFacts, SlurmFacts, SqshExport, SqshFacts
from builder.engine import local_store, staging
from builder.release import journal, multiarch, sqsh_layout
from builder.report import document as report
from tests.conftest import SETTINGS
from tests.fixture_types import DockerClient, MakeReportInputs
from tests.integration.test_multiarch_publish import (
    platform_images,  # noqa: F401 (the fixture)
    publish_killed_at,
)
from tests.unit.test_multiarch import member

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def on_cluster(m: multiarch.Member, client: DockerClient, shared: Path) -> multiarch.Member:
    """The member as if its gates had run on a cluster: its image staged by digest, a .sqsh in `shared` with its
    export record, the report naming both."""
    stage = staging.staging_repository(m.report.repository)
    digest = local_store.manifest_of(client, m.report.image_id, SETTINGS)
    ref = staging.push(digest, stage, None, SETTINGS)
    sqsh = shared / f"candidate-{m.report.platform.replace('/', '-')}.sqsh"
    sqsh.write_bytes(f"the {m.report.platform} member's .sqsh\n".encode() * 512)
    sha = hashlib.sha256(sqsh.read_bytes()).hexdigest()
    record = SqshExport(path=str(sqsh), sha256=sha, size=sqsh.stat().st_size, compression="-noD", mksquashfs="test",
                        mksquashfs_args=[], image_id=m.report.image_id, tag="candidate", registry_digest="not published",
                        entries=0, files=0, xattrs=False, enroot_files={}, equivalence="pass", smoke={}, seconds={},
                        created="")
    sqsh.with_name(sqsh.name + ".json").write_text(record.model_dump_json())
    acc, build = m.report.acceptance, m.report.build
    assert acc is not None and build is not None
    facts = SlurmFacts(**acc.where.model_dump(include=set(RunnerFacts.model_fields)),
                       sqsh=SqshFacts(path=str(sqsh), sha256=sha, image_id=m.report.image_id),
                       nodes=[NodeFacts(name="n1", sqsh_sha256=sha)])
    pulled = Pulled(ref=ref, digest=digest, image_id=m.report.image_id, engine=EngineFacts(id="local"))
    rep = m.report.model_copy(update={
        "acceptance": acc.model_copy(update={"where": facts, "pulled": pulled}),
        "build": build.model_copy(update={"staged": ImageRef(str(ref)), "manifest_digest": digest})})
    return multiarch.Member(report.write(rep, m.path.parent)["json"], rep, m.pins, m.lock)


def pointers(members: list[multiarch.Member], shared: Path) -> dict[str, Path]:
    return {m.report.platform: sqsh_layout.pointer_path(shared, m.report.repository, m.report.name,
                                                        m.report.tags[0], m.report.platform) for m in members}


def test_an_index_places_each_members_sqsh_under_its_platform(report_inputs: MakeReportInputs, tmp_path: Path,
                                                              platform_images: dict[str, str],  # noqa: F811
                                                              docker_client: DockerClient) -> None:
    """Published: each platform's pointer names that member's .sqsh and follows its digest. Then the placement
    killed (SIGKILL after the receipts, before the pointers): the next publish finishes it from the journal and
    says so. Planted: without the placement step the pointers are missing; without the journal's members the
    rerun's line names no .sqsh."""
    repo = f"127.0.0.1:5000/tests/multiarch-sqsh-{uuid.uuid4().hex[:8]}"
    shared = tmp_path / "shared"
    shared.mkdir()
    members = [on_cluster(member(report_inputs, tmp_path, "linux/amd64", repository=repo,
                                 image_id=platform_images["linux/amd64"]), docker_client, shared),
               on_cluster(member(report_inputs, tmp_path, "linux/arm64", required=["provenance"], repository=repo,
                                 image_id=platform_images["linux/arm64"]), docker_client, shared)]
    at = multiarch.publish_index([m.path for m in members], SETTINGS)
    named = pointers(members, shared)
    assert [p.name.rsplit(".", 2)[1] for p in named.values()] == ["linux-amd64", "linux-arm64"]

    def placed() -> None:
        for m in members:
            rep = report.load(m.path)
            assert rep.publish is not None and rep.publish.index == at and rep.sqsh is not None
            pointer = named[rep.platform]
            target = sqsh_layout.target(pointer)
            assert target is not None and target.name == f"sha256-{rep.sqsh.sha256}.sqsh", pointer
            assert hashlib.sha256(target.read_bytes()).hexdigest() == rep.sqsh.sha256
            assert rep.sqsh.registry_digest == rep.publish.digest and rep.sqsh.pointer == str(pointer)
            assert {r.digest for r in sqsh_layout.records(SETTINGS) if r.pointer == str(pointer)} == {
                rep.publish.digest}  # the member's digest, not the index's

    placed()
    assert sorted(p.name for p in shared.iterdir() if ".part" in p.name) == []
    for pointer in named.values():  # the placement again, killed before the pointers flip
        pointer.unlink()
    argv, env = publish_killed_at(members, "publish index: sqsh", tmp_path)
    left = journal.read(repo, SETTINGS)
    assert left is not None and [m.platform for m in left.members_sqsh] == ["linux/amd64", "linux/arm64"]
    assert not any(p.is_symlink() for p in named.values())
    rerun = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    line = next(ln for ln in rerun.stderr.splitlines() if "that a killed run began" in ln)
    assert line.endswith(".sqsh of linux/amd64, linux/arm64"), line
    placed()
    assert journal.read(repo, SETTINGS) is None
