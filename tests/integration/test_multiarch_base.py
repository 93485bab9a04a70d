"""A base pinned by a multi-arch index (builder/engine/platforms.py), with indexes pushed to the local registry:
the demo base's manifest as the amd64 entry and a real arm64 image (a static aarch64 ELF that exits 0, its config
arm64/v8) as the other. Pinned by the index, the demo builds FROM its amd64 manifest and gets the demo's image ID
(the index digest is recorded, never in the image); an index without the platform is exit 2 before any build."""
import gzip
import io
import json
import re
import struct
import tarfile
from pathlib import Path

import pytest

from builder import cli
from builder.core.errors import BadInput
from builder.core.imageref import ImageRef, digest_of
from builder.engine import platforms, registry, staging
from builder.image import build
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.pipeline import building
from builder.sources import resolve as sources
from demo.prepare import variant_pins
from tests.conftest import SETTINGS
from tests.fixture_types import DemoImage

pytestmark = pytest.mark.docker
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
# aarch64: mov x0, #0; mov x8, #93 (exit); svc #0
EXIT_0 = struct.pack("<3I", 0xD2800000, 0xD2800BA8, 0xD4000001)


def aarch64_exit_elf() -> bytes:
    """A static ELF64 executable for EM_AARCH64 (183): one PT_LOAD segment, entry right after the headers."""
    vaddr, code_at = 0x400000, 64 + 56
    size = code_at + len(EXIT_0)
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8) + struct.pack(
        "<HHIQQQIHHHHHH", 2, 183, 1, vaddr + code_at, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, vaddr, vaddr, size, size, 0x1000)
    return header + segment + EXIT_0


def push_arm64_image(reg: registry.Registry, name: str) -> dict[str, object]:
    """A one-layer linux/arm64/v8 image (/bin/true, the ELF above); its index descriptor."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = aarch64_exit_elf()
        info = tarfile.TarInfo("bin/true")
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = json.dumps({"architecture": "arm64", "variant": "v8", "os": "linux", "config": {"Cmd": ["/bin/true"]},
                         "rootfs": {"type": "layers", "diff_ids": [digest_of(raw.getvalue())]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": registry.push_blob(reg, name, config), "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                       "digest": registry.push_blob(reg, name, layer), "size": len(layer)}]}).encode()
    digest = digest_of(manifest)
    registry.put_manifest(reg, name, digest, manifest, OCI_MANIFEST)
    return {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest),
            "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}}


def push_index(reg: registry.Registry, name: str, members: list[dict[str, object]]) -> str:
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": members}).encode()
    digest = digest_of(body)
    registry.put_manifest(reg, name, digest, body, OCI_INDEX)
    return digest


@pytest.fixture(scope="module")
def indexes(demo_image: DemoImage) -> tuple[str, str, str, str]:
    """(base repository, amd64+arm64 index, arm64-only index, arm64 manifest digest) in the demo base's repository."""
    base = ImageRef(demo_image[0].base.image)
    host, name = registry.split_repository(base.name)
    reg = registry.Registry.from_settings(host, SETTINGS)
    served = reg.manifest(name, str(base.digest))
    amd64 = {"mediaType": served["media_type"], "digest": str(base.digest), "size": len(served["content"]),
             "platform": {"os": "linux", "architecture": "amd64"}}
    arm64 = push_arm64_image(reg, name)
    return base.name, push_index(reg, name, [arm64, amd64]), push_index(reg, name, [arm64]), str(arm64["digest"])


def test_an_index_resolves_to_the_pinned_platform_and_refuses_a_missing_one(
        demo_image: DemoImage, indexes: tuple[str, str, str, str]) -> None:
    name, both, arm_only, arm64 = indexes
    amd = platforms.resolve(f"{name}@{both}", "linux/amd64", SETTINGS)
    assert (amd.digest, amd.index_digest) == (demo_image[0].base.digest, both)
    assert platforms.resolve(f"{name}@{both}", "linux/arm64", SETTINGS).digest == arm64  # arm64 == arm64/v8
    plain = platforms.resolve(demo_image[0].base.image, "linux/amd64", SETTINGS)
    assert (plain.digest, plain.index_digest) == (demo_image[0].base.digest, None)  # as today
    with pytest.raises(BadInput) as err:
        platforms.resolve(f"{name}@{arm_only}", "linux/amd64", SETTINGS)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert "no linux/amd64 entry (it has linux/arm64/v8)" in str(err.value)
    host, repo = registry.split_repository(name)
    reg = registry.Registry.from_settings(host, SETTINGS)
    member = json.loads(reg.manifest_by_digest(repo, arm64))
    with pytest.raises(BadInput, match="built for linux/arm64/v8"):  # the member's config, not the index's claim
        platforms.check_config(reg, repo, member, "linux/amd64", f"{name}@{arm64}")


def test_pinned_by_its_index_the_demo_builds_from_the_platform_manifest_into_the_same_image(
        demo_image: DemoImage, indexes: tuple[str, str, str, str], tmp_path: Path) -> None:
    """A warm build (the demo's layers; the Dockerfile is the same text): a few seconds."""
    name, both, _, _ = indexes

    def by_index(data: dict[str, object]) -> None:
        data["base"]["image"] = f"{name}@{both}"  # type: ignore[index]
    pins_path = variant_pins(tmp_path, edit=by_index, pins_path=demo_image[0].path, share_cache=True)
    lock_path = tmp_path / pins_mod.load(pins_path).build.lock
    # the same platform's lock: written for the index digest (what `builder lock` records for these pins)
    lock_path.write_text(re.sub(r"base=sha256:[0-9a-f]{64}", f"base={both}", lock_path.read_text()))
    pins = pins_mod.load(pins_path)
    rendered = building.render(pins, lock_record.of(pins), sources.resolve(pins, SETTINGS), SETTINGS)
    demo_digest = demo_image[0].base.digest
    assert f"FROM {name}@{demo_digest}" in rendered.dockerfile and both not in rendered.dockerfile
    assert rendered.labels[staging.BASE_DIGEST] == demo_digest
    built = build.build(rendered, SETTINGS, echo=False)
    assert built.image_id == demo_image[3].image_id
    assert (built.base_digest, built.base_index_digest) == (demo_digest, both)
    # the engine's base layers were checked against the platform manifest; an index there is taken to the platform
    assert staging.base_of({staging.BASE_NAME: name, staging.BASE_DIGEST: both}, SETTINGS, "linux/amd64") == \
        staging.base_of(rendered.labels, SETTINGS)


def test_lock_and_build_refuse_an_index_without_the_platform_before_anything_else(
        demo_image: DemoImage, indexes: tuple[str, str, str, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    name, _, arm_only, _ = indexes

    def arm_only_index(data: dict[str, object]) -> None:
        data["base"]["image"] = f"{name}@{arm_only}"  # type: ignore[index]
    pins_path = variant_pins(tmp_path, edit=arm_only_index, pins_path=demo_image[0].path)
    with pytest.raises(BadInput, match=r"no linux/amd64 entry \(it has linux/arm64/v8\)"):
        building.lock(pins_path, SETTINGS)  # before the base is read in a container
    capsys.readouterr()
    assert cli.run(["build", str(pins_path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no linux/amd64 entry (it has linux/arm64/v8)" in errors[0], errors
