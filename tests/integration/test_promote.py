"""Staging -> accept -> promote: release tags only ever point at the digest acceptance pulled.
A report edited to name another digest, or a staging manifest replaced after acceptance, gets no tag."""
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import PublishError
from builder.core.records import EngineFacts
from builder.engine import staging
from builder.engine.registry import Registry, split_repository
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.pipeline import releasing
from builder.report import document as report_mod
from demo.prepare import variant_pins
from tests.conftest import SETTINGS
from tests.fixture_types import DemoAccepted, DemoImage, DockerClient

pytestmark = pytest.mark.docker
RELEASE = "127.0.0.1:5000/tests-promote/unified"


@pytest.fixture
def accepted_by_digest(demo_accepted: DemoAccepted, docker_client: DockerClient, tmp_path: Path
                       ) -> Iterator[tuple[Path, str, str]]:
    """An ACCEPTED report whose acceptance pulled the demo image by digest from a staging repository of
    this test alone; yields (report.json path, staged ref, release tag)."""
    pins, resolved, built, result = demo_accepted
    stage = f"127.0.0.1:5000/tests-promote/staging-{time.time_ns()}"
    ref = staging.push(built.manifest_digest, stage, pins.base.name, SETTINGS)
    pulled = staging.pull(docker_client, ref, built.image_id, SETTINGS)  # a real pull by digest
    acceptance = result.model_copy(update={"pulled": pulled.model_copy(update={"engine": EngineFacts(id="local")})})
    tag = f"t{time.time_ns()}"

    def release(data: dict[str, Any]) -> None:  # this test's own release repository and tag, in a pins file publish re-reads
        data["image"].update(repository=RELEASE, tags=[tag])

    release_pins = pins_mod.load(variant_pins(tmp_path / "pins", edit=release, pins_path=pins.path))
    resolved = resolved.model_copy(update={"pins_path": str(release_pins.path), "pins_sha256": release_pins.sha256})
    report = report_mod.make_report(release_pins, lock_record.of(release_pins), resolved,
                                    built.model_copy(update={"staged": ref}), acceptance)
    assert report.verdict == "ACCEPTED" and report.repository == RELEASE and tag in report.tags
    yield report_mod.write(report, tmp_path)["json"], ref, tag
    # leave no manifest of this test behind: its staging repository and its release tag
    reg, name = registry_for(ref)
    for digest in {d for d in (ref.partition("@")[2], reg.tag_digest(name, "run")) if d}:
        reg.delete_manifest(name, digest)
    rel, rel_name = registry_for(RELEASE + "@x")
    released = rel.tag_digest(rel_name, tag)
    if released:
        rel.delete_manifest(rel_name, released)


def registry_for(ref: str) -> tuple[Registry, str]:
    host, name = split_repository(ref.partition("@")[0])
    return Registry(host), name


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def base_manifest_into(stage_ref: str, base_image: str) -> tuple[str, str]:
    """Put the base image's manifest (a digest that never passed acceptance) into the staging repo."""
    reg, name = registry_for(stage_ref)
    base_host_name, _, base_digest = base_image.partition("@")
    base_name = split_repository(base_host_name)[1]
    body = reg.manifest_by_digest(base_name, base_digest)
    doc = json.loads(body)
    for desc in [*doc["layers"], doc["config"]]:
        assert reg.has_blob(name, desc["digest"]) or reg.mount_blob(name, desc["digest"], base_name)
    return reg.put_manifest(name, base_digest, body, doc["mediaType"]), reg.put_manifest(name, "run", body, doc["mediaType"])


def test_promote_tags_exactly_the_accepted_digest(accepted_by_digest: tuple[Path, str, str], demo_accepted: DemoAccepted) -> None:
    report_json, ref, tag = accepted_by_digest
    receipt = releasing.publish_report(report_json, SETTINGS)
    digest = ref.partition("@")[2]
    assert receipt.digest == digest == demo_accepted[2].manifest_digest
    assert receipt.config_digest == demo_accepted[2].image_id
    reg, name = registry_for(RELEASE + "@x")
    assert reg.tag_digest(name, tag) == digest
    published = report_mod.load(report_json).publish
    assert published is not None and published.digest == digest


@pytest.mark.parametrize("fields", ["pulled_only", "everything"])
def test_report_edited_to_name_another_digest_gets_no_tag(accepted_by_digest: tuple[Path, str, str], demo_image: DemoImage,
                                                          fields: str) -> None:
    report_json, ref, tag = accepted_by_digest
    other, _ = base_manifest_into(ref, demo_image[0].base.image)
    other_ref = ref.partition("@")[0] + "@" + other

    def change(data: dict[str, Any]) -> None:
        data["acceptance"]["pulled"].update(ref=other_ref, digest=other)
        if fields == "everything":
            data["build"].update(staged=other_ref, manifest_digest=other)

    edit(report_json, change)
    with pytest.raises(PublishError, match="acceptance|refusing"):
        releasing.publish_report(report_json, SETTINGS)
    reg, name = registry_for(RELEASE + "@x")
    assert reg.tag_digest(name, tag) is None


def test_staging_manifest_replaced_after_acceptance_gets_no_tag(accepted_by_digest: tuple[Path, str, str],
                                                                demo_image: DemoImage) -> None:
    report_json, ref, tag = accepted_by_digest
    reg, name = registry_for(ref)
    assert reg.delete_manifest(name, ref.partition("@")[2])
    base_manifest_into(ref, demo_image[0].base.image)  # something else now sits in staging
    with pytest.raises(PublishError, match="404|not"):
        releasing.publish_report(report_json, SETTINGS)
    rel, rel_name = registry_for(RELEASE + "@x")
    assert rel.tag_digest(rel_name, tag) is None
