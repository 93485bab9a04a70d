"""A base pinned by a multi-arch index (builder/engine/platforms.py): the entry for base.platform, normalised as
the engine does; an index without it is refused in one line naming the platforms it has."""
from typing import Any

import pytest

from builder.core.errors import BadInput
from builder.engine.platforms import Platform, choose

AMD64, ARM64, ARM64_V9 = "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64


def entry(digest: str, arch: str, variant: str | None = None, os: str = "linux") -> dict[str, Any]:
    platform = {"os": os, "architecture": arch, **({"variant": variant} if variant else {})}
    return {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": 1,
            "platform": platform}


def index(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": list(entries)}


@pytest.mark.parametrize("pinned, entries, want", [
    ("linux/amd64", [entry(ARM64, "arm64", "v8"), entry(AMD64, "amd64")], AMD64),
    ("linux/arm64", [entry(AMD64, "amd64"), entry(ARM64, "arm64", "v8")], ARM64),   # arm64 is arm64/v8
    ("linux/arm64", [entry(ARM64, "arm64")], ARM64),                                # a missing variant matches
    ("linux/arm64/v8", [entry(ARM64, "arm64", "8")], ARM64),                        # '8' as the engine writes v8
    ("linux/arm64", [entry(ARM64_V9, "arm64", "v9"), entry(ARM64, "arm64", "v8")], ARM64),
    ("linux/amd64", [entry(ARM64, "amd64", os="windows"), entry(AMD64, "amd64")], AMD64),
])
def test_the_entry_for_the_pinned_platform(pinned: str, entries: list[dict[str, Any]], want: str) -> None:
    assert choose(index(*entries), pinned, "r/base@sha256:...") == want


def test_an_index_without_the_platform_is_refused_naming_what_it_has() -> None:
    attestation = {"digest": "sha256:" + "d" * 64, "platform": {"os": "unknown", "architecture": "unknown"}}
    with pytest.raises(BadInput) as err:
        choose(index(entry(ARM64, "arm64", "v8"), attestation), "linux/amd64", "r/base@sha256:1")
    line = str(err.value)
    assert "\n" not in line and err.value.exit_code == 2
    assert "no linux/amd64 entry" in line and "linux/arm64/v8" in line and "r/base@sha256:1" in line
    with pytest.raises(BadInput, match="arm64/v9"):  # another variant is another platform
        choose(index(entry(ARM64_V9, "arm64", "v9")), "linux/arm64", "r/base@sha256:1")


def test_platform_matching_reads_configs_too() -> None:
    assert Platform.parse("linux/amd64").matches({"os": "linux", "architecture": "amd64"})
    assert not Platform.parse("linux/amd64").matches({"os": "linux", "architecture": "arm64"})
    with pytest.raises(BadInput, match="base.platform"):
        Platform.parse("amd64")
