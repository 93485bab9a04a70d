"""A release that a kill cannot split (docs/release.md): `builder publish --key` is SIGKILLed at each phase
boundary (the fail points of builder/core/faults.py) and at random moments; straight after each kill every
release tag serves its old digest or the new one, a tag serves the new one only once its three attestations
verify, and the moving tag only after the SHA tag. The next publish reads the journal, says in one line what it
did, and leaves a verified release with no journal and no part file behind. Before the tags it finishes only with
the key, the report and its unchanged pins and lock at hand; otherwise it abandons.

Bounded: one accepted report (the session's accepted demo image and its staged digest) and a copy of it as if
accepted on a cluster (its .sqsh placed by publish), 6 phase cells and RANDOM_KILLS random kills, each a killed
publish and its recovering rerun (about 2-3 s each).
"""
from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from builder.core.imageref import ImageRef
from builder.core.records import EngineFacts, NodeFacts, Pulled, Report, RunnerFacts, SlurmFacts, SqshExport, SqshFacts
from builder.engine.registry import Registry, split_repository
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.release import attest, dsse, journal, publish, referrers, sqsh_layout, verify
from builder.report import document as report_mod
from demo.prepare import variant_pins
from tests.conftest import SETTINGS
from tests.fixture_types import DemoAccepted

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
RANDOM_KILLS = 8
RUN_TIMEOUT_S = 120


@dataclass
class Release:
    report: Path
    key: Path
    repository: str
    name: str
    tags: list[str]  # the SHA tag first, then the moving tag
    old: str  # the digest every tag serves before each trial
    new: str  # the accepted digest
    reg: Registry
    cluster: Path  # the same report as if accepted on a cluster: publish places its .sqsh
    local: Path  # the same report as if accepted on the local image: publish stages it by digest first


@pytest.fixture(scope="module")
def release(demo_accepted: DemoAccepted, staged_demo: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """An ACCEPTED, signed report of the session's accepted demo image, as if acceptance had pulled the session's
    staged digest; its release repository (this module's own) has both tags on the base image (the old release)."""
    pins, resolved, built, result = demo_accepted
    tmp = tmp_path_factory.mktemp("kills")
    repository = f"127.0.0.1:5000/tests-kills/unified-{time.time_ns()}"
    ref = ImageRef(staged_demo)
    pulled = Pulled(ref=ref, digest=built.manifest_digest, image_id=built.image_id, engine=EngineFacts(id="local"))
    acceptance = result.model_copy(update={"pulled": pulled})

    def edit(data: dict[str, object]) -> None:
        data["image"].update(repository=repository, tags=["demo"])  # type: ignore[attr-defined]

    release_pins = pins_mod.load(variant_pins(tmp / "pins", edit=edit, pins_path=pins.path))
    resolved = resolved.model_copy(update={"pins_path": str(release_pins.path), "pins_sha256": release_pins.sha256})
    report = report_mod.make_report(release_pins, lock_record.of(release_pins), resolved,
                                    built.model_copy(update={"staged": ref}), acceptance)
    run_dir = tmp / "run"
    report_json = report_mod.write(report, run_dir)["json"]
    tags = list(report.tags)  # the SHA tag, then `demo`
    assert len(tags) == 2 and tags[1] == "demo", tags
    key = tmp / "key.pem"
    dsse.keygen(key, tmp / "key.pub")
    attest.sign_acceptance(report, release_pins, dsse.load_private(key), run_dir)
    host, name = split_repository(repository)
    reg = Registry(host)
    base_host_name, _, base_digest = str(pins.base.image).partition("@")
    body = reg.manifest_by_digest(split_repository(base_host_name)[1], base_digest)
    old = old_release(reg, name, split_repository(base_host_name)[1], body, tags)
    cluster = cluster_report(report, release_pins, dsse.load_private(key), tmp / "cluster-run", tmp / "shared")
    local = local_report(report, release_pins, dsse.load_private(key), tmp / "local-run")
    yield Release(report_json, key, repository, name, tags, old, built.manifest_digest, reg, cluster, local)
    journal.delete_with_referrers(reg, name, built.manifest_digest)
    reg.delete_manifest(name, old)


def cluster_report(report: Report, pins: pins_mod.Pins, key: dsse.PrivateKey, run_dir: Path,
                   shared: Path) -> Path:
    """The report as if its gates had run on a cluster from a candidate .sqsh in `shared` (the bytes stand in for
    a squashfs: placement moves and hashes them; test_cluster_publish places a real one), with its export record."""
    shared.mkdir()
    candidate = shared / "candidate.sqsh"
    candidate.write_bytes(b"candidate .sqsh of the new release\n" * 4096)
    sha = hashlib.sha256(candidate.read_bytes()).hexdigest()
    record = SqshExport(path=str(candidate), sha256=sha, size=candidate.stat().st_size, compression="-noD",
                        mksquashfs="test", mksquashfs_args=[], image_id=report.image_id, tag="candidate",
                        registry_digest="not published", entries=0, files=0, xattrs=False, enroot_files={},
                        equivalence="pass", smoke={}, seconds={}, created="")
    candidate.with_name(candidate.name + ".json").write_text(record.model_dump_json())
    assert report.acceptance is not None
    facts = SlurmFacts(**report.acceptance.where.model_dump(include=set(RunnerFacts.model_fields)),
                       sqsh=SqshFacts(path=str(candidate), sha256=sha, image_id=report.image_id),
                       nodes=[NodeFacts(name="n1", sqsh_sha256=sha)])
    report = report.model_copy(update={"acceptance": report.acceptance.model_copy(update={"where": facts})})
    path = report_mod.write(report, run_dir)["json"]
    attest.sign_acceptance(report, pins, key, run_dir)
    return path


def local_report(report: Report, pins: pins_mod.Pins, key: dsse.PrivateKey, run_dir: Path) -> Path:
    """The report as if its gates had run on the local image (no staged digest): publish pushes the image's stored
    blobs to staging by digest first."""
    assert report.acceptance is not None and report.build is not None
    report = report.model_copy(update={"acceptance": report.acceptance.model_copy(update={"pulled": None}),
                                       "build": report.build.model_copy(update={"staged": None})})
    path = report_mod.write(report, run_dir)["json"]
    attest.sign_acceptance(report, pins, key, run_dir)
    return path


def old_release(reg: Registry, name: str, base_name: str, body: bytes, tags: list[str]) -> str:
    import json

    doc = json.loads(body)
    for desc in [*doc["layers"], doc["config"]]:
        assert reg.has_blob(name, desc["digest"]) or reg.mount_blob(name, desc["digest"], base_name)
    for tag in tags:
        old = reg.put_manifest(name, tag, body, doc["mediaType"])
    return old


def reset(rel: Release) -> None:
    """Both tags back on the old release, the new digest gone with its attestations: a first publish again."""
    body = rel.reg.manifest_by_digest(rel.name, rel.old)
    for tag in rel.tags:
        rel.reg.put_manifest(rel.name, tag, body, "application/vnd.oci.image.manifest.v1+json"
                             if b"vnd.oci" in body[:200] else "application/vnd.docker.distribution.manifest.v2+json")
    journal.delete_with_referrers(rel.reg, rel.name, rel.new)
    assert rel.reg.tag_digest(rel.name, rel.new) is None
    for path in (rel.report, rel.cluster, rel.local):  # the receipt of the previous trial goes: "not published" again
        if report_mod.load(path).publish is not None:
            report_mod.write(report_mod.load(path).model_copy(update={"publish": None, "sqsh": None}), path.parent)


def env(rel: Release, failpoint: str = "", hold: Path | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("BUILDER_FAILPOINT")}
    out.update(PYTHONPATH=str(ROOT), BUILDER_SIGNING_KEY=str(rel.key))
    if failpoint:
        out.update(BUILDER_FAILPOINT=failpoint, BUILDER_FAILPOINT_HOLD=str(hold))
    return out


def check_invariant(rel: Release, when: str) -> dict[str, str | None]:
    """Each tag on old or new; new only when attested (all three, verified with the key); the moving tag on new
    only when the SHA tag serves it."""
    served = {t: rel.reg.tag_digest(rel.name, t) for t in rel.tags}
    public = dsse.load_public(rel.key.with_suffix(".pub"))
    for tag, digest in served.items():
        assert digest in (rel.old, rel.new), f"{when}: {tag} serves {digest}, neither old nor new"
        if digest == rel.new:
            types = {t for t, _ in attest.attached_by(rel.reg, rel.name, rel.new, public).values()}
            assert types >= set(attest.PREDICATE_TYPES), f"{when}: {tag} serves the new digest with only {types}"
    if any(served[t] == rel.new for t in rel.tags[1:]):
        assert served[rel.tags[0]] == rel.new, f"{when}: a moving tag moved before the SHA tag: {served}"
    return served


def recovered(rel: Release, when: str, report: Path | None = None) -> str:
    """The rerun: exit 0, one journal line (when a journal was left), a verified release, nothing left behind."""
    left = journal.read(rel.repository, SETTINGS)
    report = report or rel.report
    rerun = subprocess.run([sys.executable, "-m", "builder", "publish", str(report)], cwd=ROOT, env=env(rel),
                           capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert rerun.returncode == 0, f"{when}: {rerun.stderr[-3000:]}"
    lines = [ln for ln in rerun.stderr.splitlines() if "that a killed run began" in ln]
    assert len(lines) == (1 if left else 0), f"{when}: {lines}"
    assert journal.read(rel.repository, SETTINGS) is None, f"{when}: the journal outlived the rerun"
    listed = {d["digest"] for d in referrers.discover(rel.reg, rel.name, rel.new)}
    orphans = [a for a in (left.artifacts if left else []) if a not in listed and rel.reg.tag_digest(rel.name, a)]
    assert orphans == [], f"{when}: attestations no index lists: {orphans}"
    assert all(rel.reg.tag_digest(rel.name, t) == rel.new for t in rel.tags)
    outcome = verify.verify(f"{rel.repository}:{rel.tags[1]}", [dsse.load_public(rel.key.with_suffix(".pub"))],
                            SETTINGS)
    assert outcome.reference == f"{rel.repository}@{rel.new}"
    published = report_mod.load(report).publish
    assert published is not None and published.digest == rel.new, f"{when}: the report disagrees with the registry"
    parts = [p.name for d in (report.parent, rel.cluster.parent.parent / "shared") for p in d.iterdir()
             if ".part" in p.name]
    assert parts == [], parts
    return lines[0] if lines else ""


def kill_at(rel: Release, failpoint: str, tmp_path: Path, report: Path | None = None,
            killed: Callable[[], None] | None = None) -> str:
    hold = tmp_path / "hold"
    hold.touch()
    report = report or rel.report
    proc = subprocess.Popen([sys.executable, "-m", "builder", "publish", str(report)], cwd=ROOT,
                            env=env(rel, failpoint, hold), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith(f"failpoint {failpoint}"):
            break
    else:
        proc.wait()
        pytest.fail(f"never reached {failpoint!r}: {''.join(seen[-20:])}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    hold.unlink()
    check_invariant(rel, f"killed at {failpoint}")
    if killed is not None:  # the caller's look at what the kill left, before the rerun
        killed()
    return recovered(rel, failpoint, report)


# fail point -> what the rerun must say it did (before the tags: the key, pins and lock match, so it finishes)
PHASES = {
    "publish: manifest": "finished",  # after the manifest PUT by digest, before any attestation
    "publish: blob upload": "finished",  # an upload session opened, its PUT not sent
    "publish: artifact": "finished",  # an attestation artifact pushed, its referrers index not yet
    "promote tag 1": "finished",  # the SHA tag moved, the moving tag not yet
    "publish: receipt": "finished",  # every tag moved, the receipt not written
}


@pytest.mark.parametrize("failpoint", list(PHASES))
def test_kill_at_phase_boundary(release: Release, failpoint: str, tmp_path: Path) -> None:
    reset(release)
    line = kill_at(release, failpoint, tmp_path)
    assert line.startswith(PHASES[failpoint]) or f" {PHASES[failpoint]} " in line, line


def test_kill_before_the_sqsh_placement(release: Release, tmp_path: Path) -> None:
    """A cluster-accepted publish killed after its receipt, before the .sqsh pointer flips: the pointer still names
    the old release's .sqsh (no pointer at all would be as right); the rerun flips it onto the new file, which is
    kept by its sha256 with a `.sha256` that agrees. Planted: the journal's recovery without the .sqsh step leaves
    the pointer on the old file (the rerun's own placement is not reached: its journal line is asserted)."""
    reset(release)
    shared = release.cluster.parent.parent / "shared"
    for path in shared.glob("sha256-*"):
        path.unlink()
    report = report_mod.load(release.cluster)
    old_sha = hashlib.sha256(b"the old release's .sqsh\n").hexdigest()
    old_blob, _ = sqsh_layout.keep(_part(shared, b"the old release's .sqsh\n"), old_sha)
    pointer = sqsh_layout.pointer_path(shared, release.repository, report.name, release.tags[0], report.platform)
    sqsh_layout.point(pointer, old_blob)
    sqsh_layout.remember(SETTINGS, sqsh_layout.Pointer(pointer=str(pointer), repository=release.repository,
                                                       tag=release.tags[0], platform=report.platform,
                                                       digest=release.old, sha256=old_sha))
    line = kill_at(release, "publish: sqsh", tmp_path, release.cluster)
    assert line.startswith("finished") and line.endswith(".sqsh"), line
    new = report_mod.load(release.cluster)
    assert new.sqsh is not None and new.sqsh.registry_digest == release.new and new.sqsh.pointer == str(pointer)
    target = sqsh_layout.target(pointer)
    assert target is not None and target.name == f"sha256-{new.sqsh.sha256}.sqsh" and str(target) == new.sqsh.path
    assert hashlib.sha256(target.read_bytes()).hexdigest() == new.sqsh.sha256
    assert sqsh_layout.sums_path(target).read_text() == f"{new.sqsh.sha256}  {target.name}\n"
    assert {r.digest for r in sqsh_layout.records(SETTINGS) if r.pointer == str(pointer)} == {release.new}


def test_kill_in_the_local_images_push_to_staging(release: Release, tmp_path: Path) -> None:
    """A report accepted on the local image: publish pushes its stored blobs to staging by digest through the
    registry API (no engine push, no tag there), journaled. SIGKILL with an upload session open, before its PUT: the
    tags stay on the old release and the journal names the session; the rerun cancels it and finishes the publish of
    the very digest the staged path publishes. Planted: the engine's push by a tag (the old path) leaves a tag in
    staging; no session in the journal (or no cancel) leaves it open."""
    reset(release)
    stage = f"{release.name}-staging"
    for tag in release.reg.tags(stage):  # another test's staged digests: the upload below must be a first one
        digest = release.reg.tag_digest(stage, tag)
        if digest:
            release.reg.delete_manifest(stage, digest)
    sessions: list[str] = []

    def killed() -> None:
        left = journal.read(release.repository, SETTINGS)
        assert left is not None and left.phase == "manifest" and left.uploads, left
        assert all(release.reg.tag_digest(release.name, t) == release.old for t in release.tags)
        sessions.extend(left.uploads)

    line = kill_at(release, "publish: staging upload", tmp_path, release.local, killed)
    assert line.startswith("finished"), line
    assert release.reg._request("GET", sessions[0]).status_code == 404, "the killed run's upload session is open"
    assert release.reg.tags(stage) == [], "a tag in staging: the local image went by tag, not by digest"
    assert release.reg.tag_digest(stage, release.new) == release.new


def _part(directory: Path, data: bytes) -> Path:
    part = directory / f".old.{os.getpid()}.x.part"
    part.write_bytes(data)
    return part


def test_before_the_tags_changed_pins_or_no_key_abandon(release: Release, tmp_path: Path) -> None:
    """Killed after the manifest: with the report's pins edited since, or without the key that was attesting it,
    the next command abandons it (the new digest deleted, the tags on the old one); with both at hand and
    unchanged the phase cells above see it finished. Planted: a resume that skips trust.check finishes it."""
    pins_path = Path(report_mod.load(release.report).sources.pins_path)
    text = pins_path.read_text()
    for case in ("pins", "key"):
        reset(release)
        hold = tmp_path / "hold"
        hold.touch()
        proc = subprocess.Popen([sys.executable, "-m", "builder", "publish", str(release.report)], cwd=ROOT,
                                env=env(release, "publish: manifest", hold), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for got in proc.stderr:
            if got.startswith("failpoint publish: manifest"):
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        hold.unlink()
        key = None if case == "key" else dsse.load_private(release.key)
        if case == "pins":
            pins_path.write_text(text + "# edited after the run\n")
        try:
            line = journal.recover(release.repository, SETTINGS, release.reg, publish.receipt_after_kill,
                                   partial(publish.resume, registry=release.reg, key=key, settings=SETTINGS))
        finally:
            pins_path.write_text(text)
        assert line.startswith("abandoned") and ("pins_sha256" if case == "pins" else "not at hand") in line, line
        assert release.reg.tag_digest(release.name, release.new) is None, line
        assert all(release.reg.tag_digest(release.name, t) == release.old for t in release.tags)
        assert journal.read(release.repository, SETTINGS) is None


def test_abandoned_when_another_digest_publishes(release: Release, tmp_path: Path) -> None:
    """A journal of a killed publish of another digest, before its tags: abandoned, its digest deleted."""
    reset(release)
    journal.write(journal.Journal(repository=release.repository, report=str(tmp_path / "gone.json"),
                                  digest="sha256:" + "0" * 64, media_type="", phase="attest",
                                  tags=[journal.TagMove(tag=t, old=release.old, new="sha256:" + "0" * 64)
                                        for t in release.tags]), SETTINGS)
    line = recovered(release, "another digest")
    assert "abandoned" in line, line


def started(rel: Release, hold: Path) -> subprocess.Popen[str]:
    """A publish, returned once its release step (the first registry write) begins: the fail point `release` with
    no hold file only prints its line."""
    proc = subprocess.Popen([sys.executable, "-m", "builder", "publish", str(rel.report)], cwd=ROOT, text=True,
                            env=env(rel, "release", hold), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("failpoint release"):
            break
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # never blocks on a full pipe
    return proc


def test_random_kills(release: Release, tmp_path: Path) -> None:
    """RANDOM_KILLS SIGKILLs at random moments of a publish's registry writes (their length measured first)."""
    reset(release)
    proc = started(release, tmp_path / "no-hold")
    start = time.monotonic()
    assert proc.wait(timeout=RUN_TIMEOUT_S) == 0
    length = time.monotonic() - start
    report_mod.write(report_mod.load(release.report).model_copy(update={"publish": None}), release.report.parent)
    rng = random.Random(os.environ.get("BUILDER_KILL_SEED", "51"))
    phases: dict[str, int] = {}
    for i in range(RANDOM_KILLS):
        reset(release)
        proc = started(release, tmp_path / "no-hold")
        time.sleep(rng.uniform(0.0, 0.7 * length))  # its tail: the receipt, the journal removed, exit
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        check_invariant(release, f"random kill {i}")
        left = journal.read(release.repository, SETTINGS)
        phases[left.phase if left else "none"] = phases.get(left.phase if left else "none", 0) + 1
        recovered(release, f"random kill {i}")
    print(f"random kills by the journal's phase: {phases} (publish's registry part: {length:.2f} s)")
