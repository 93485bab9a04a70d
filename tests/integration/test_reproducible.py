"""Reproducible images on the real engine: a cold rebuild (no cache, the image removed first) gives the
same image ID and manifest digest, `rebuild --check` passes on the demo and fails on a build that
stamps the time, naming that file."""
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from builder.core.records import BuiltImage, ResolvedSources
from builder.engine import client as engine
from builder.engine import normalize, staging
from builder.engine.registry import Registry, split_repository
from builder.image import build
from builder.lock import record as lock_record
from builder.pins.model import Pins
from builder.pipeline import releasing
from builder.report import document as report_mod
from tests.conftest import SETTINGS
from tests.fixture_types import DockerClient

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker


def write_report(pins: Pins, resolved: ResolvedSources, built: BuiltImage, out: Path) -> Path:
    report = report_mod.make_report(pins, lock_record.of(pins), resolved, built, None)
    return report_mod.write(report, out)["json"]


def test_cold_rebuild_after_removing_the_image_gives_the_same_digests(demo_pins: Path, docker_client: DockerClient,
                                                                      tmp_path: Path) -> None:
    """On a copy of the demo with a build input (verl's install env) and a repository of its own, in the demo's
    cache scope: it differs from the demo from the verl layer on, the layers before are the demo's cached ones. A
    name of its own is not enough: the image holds build inputs only (builder/image/identity.py), so a renamed copy
    is the demo image itself, whose tags and containers (other workers' gates) are not this test's to remove.
    Then the build right after the no-cache rebuild hits every step (the rebuild dropped its own chain).
    Over 60 s under load: the no-cache rebuild runs every step of the image, which is the point."""
    from demo.prepare import variant_pins
    from tests.conftest import _resolve_render_build

    def own_copy(data: dict[str, Any]) -> None:
        data["name"] = "demo-reproducible"
        data["image"]["repository"] = data["image"]["repository"] + "-reproducible"  # its tags are not the demo's
        data["components"]["verl"]["install"]["env"] = {"BUILDER_TEST_COPY": "reproducible"}
    pins_path = variant_pins(tmp_path / "pins", edit=own_copy, pins_path=demo_pins, share_cache=True)
    pins, resolved, rendered, built = _resolve_render_build(pins_path)
    staged = staging.push(built.manifest_digest, staging.staging_repository(pins.image.repository, pins.image.staging),
                          pins.base.name, SETTINGS)
    config_digest = json.loads(normalize.blob_path(SETTINGS, built.manifest_digest).read_bytes())["config"]["digest"]
    assert built.image_id == config_digest  # the local image ID is the config digest
    host, name = split_repository(staged.partition("@")[0])
    assert Registry(host).manifest(name, built.manifest_digest)["computed"] == built.manifest_digest
    report_json = write_report(pins, resolved, built, tmp_path)
    attrs = docker_client.api.inspect_image(built.image_id)
    try:
        for ref in attrs.get("RepoTags", []) + attrs.get("RepoDigests", []):
            engine.remove_image(docker_client, ref)  # every local reference (the image goes unless a child holds it)
        assert engine.inspect_image(docker_client, built.image_id) is None
        result = releasing.rebuild_check(report_json, SETTINGS)
        assert result["status"] == "same", json.dumps(result)[:3000]
        assert result["rebuild"] == {"image_id": built.image_id, "manifest_digest": built.manifest_digest}
        again = staging.push(result["rebuild"]["manifest_digest"], staged.partition("@")[0], pins.base.name, SETTINGS)
        assert again == staged
        # the no-cache build removed the intermediate images it made: the engine would take that newer chain as
        # the cache parent (the next build would follow it and miss from the compiler-cache seed on). So the
        # build right after hits every step, with the same digest
        steps = json.loads(Path(result["log"][: -len(".log")] + ".steps.json").read_text())
        made = [s["image"] for s in steps if not s["cached"] and not s["instruction"].startswith(("FROM ", "ARG "))]
        assert made and all(engine.inspect_image(docker_client, image) is None for image in made)
        after = _resolve_render_build(pins_path)[3]
        assert after.cached, [s["instruction"][:80] for s in json.loads(build.steps_file(after).read_text())
                              if not s["cached"] and not s["instruction"].startswith(("FROM ", "ARG "))][:3]
        assert (after.image_id, after.manifest_digest) == (built.image_id, built.manifest_digest)
    finally:
        for ref in [rendered.tag, *built.tags]:
            engine.remove_image(docker_client, ref)
    rebuild = report_mod.load(report_json).rebuild
    assert rebuild is not None and rebuild["status"] == "same"


def test_rebuild_check_catches_a_build_step_that_stamps_the_time(stamped_pins: Path, tmp_path: Path) -> None:
    from tests.conftest import _resolve_render_build

    pins, resolved, rendered, built = _resolve_render_build(stamped_pins)
    client = engine.connect(SETTINGS)
    try:
        report_json = write_report(pins, resolved, built, tmp_path)
        proc = subprocess.run([sys.executable, "-m", "builder.cli", "rebuild", "--check", str(report_json)], cwd=ROOT,
                              capture_output=True, text=True, timeout=1200, env=dict(os.environ))
    finally:
        for tag in built.tags:
            engine.remove_image(client, tag)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "diff in" in proc.stderr
    result = report_mod.load(report_json).rebuild
    assert result is not None
    assert result["status"] == "different"
    paths = [e["path"] for layer in result["layers"] for e in layer["entries"]]
    stamped = [p for p in paths if p.endswith("/site-packages/tinyrl/BUILD_TIME")]
    assert stamped, paths
    entry = next(e for layer in result["layers"] for e in layer["entries"] if e["path"] == stamped[0])
    assert entry["change"] == "modified" and "sha256" in entry["fields"]
    # everything else that differs follows from that file: its RECORD line and the image manifest's hash of it
    assert all(p.endswith(("/BUILD_TIME", "/RECORD", "/opt/delivery/manifest.json")) for p in paths), paths
    assert "BUILD_TIME" in (tmp_path / "report.md").read_text()
