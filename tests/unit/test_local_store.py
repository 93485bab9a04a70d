"""builder/engine/local_store.py without an engine: which stored manifest a local image's push by digest uses (the
build's, a normalise record's, one saved before; never one that does not hash to its name or names another config),
and that a layer gzipped here gets the same digest again (a rerun after a kill pushes the same manifest)."""
import dataclasses
import io
import json
import tarfile
from pathlib import Path

from builder.core.imageref import digest_of
from builder.core.options import Settings
from builder.engine import local_store, normalize


def settings(tmp_path: Path) -> Settings:
    return dataclasses.replace(Settings.from_env({}), cache_root=tmp_path / "cache")


def stored(s: Settings, config: bytes, layers: list[normalize.Descriptor]) -> str:
    """A config and a manifest over it in the store; the manifest's digest."""
    (normalize.blob_path(s, digest_of(config))).write_bytes(config)
    body = normalize.manifest_bytes(normalize.Descriptor(normalize.CONFIG_TYPE, len(config), digest_of(config)), layers)
    normalize.blob_path(s, digest_of(body)).write_bytes(body)
    return digest_of(body)


class NoEngine:
    """Any use of the engine fails the test: a stored image is never saved again."""

    @property
    def api(self) -> object:
        raise AssertionError("the engine was asked for an image the store holds")


def test_the_stored_manifest_of_the_image_is_used_and_no_other(tmp_path: Path) -> None:
    s = settings(tmp_path)
    mine, other = b'{"config":{"Labels":{}},"n":1}', b'{"config":{},"n":2}'
    image = digest_of(mine)
    digest = stored(s, mine, [])
    wrong = stored(s, other, [])
    assert local_store.manifest_of(NoEngine(), image, s, hint=digest) == digest
    # a hint naming another image's manifest, or none: the normalise record names it
    records = normalize.store(s, "records")
    (records / "x.json").write_text(json.dumps({"image_id": image, "manifest_digest": digest}))
    assert local_store.manifest_of(NoEngine(), image, s, hint=wrong) == digest
    # a stored manifest whose bytes no longer hash to its name is not used
    (records / "x.json").unlink()
    (normalize.store(s, "local") / image.split(":")[1]).write_text(digest + "\n")
    assert local_store.manifest_of(NoEngine(), image, s) == digest
    normalize.blob_path(s, digest).write_bytes(b"{}")
    try:
        local_store.manifest_of(NoEngine(), image, s)
    except AssertionError as err:
        assert "the engine was asked" in str(err)
    else:
        raise AssertionError("a corrupt stored manifest was used")


def test_a_layer_gzipped_here_gets_the_same_digest_again(tmp_path: Path) -> None:
    s = settings(tmp_path)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"hello\n"))
    src = tmp_path / "layer.tar"
    src.write_bytes(raw.getvalue())
    first = local_store._gzip(s, src)
    normalize.blob_path(s, first.digest).unlink()
    again = local_store._gzip(s, src)
    assert again == first and digest_of(normalize.blob_path(s, first.digest).read_bytes()) == first.digest
    assert first.mediaType == normalize.LAYER_TYPE and [p.name for p in normalize.store(s, "blobs", "sha256").iterdir()
                                                         if ".part" in p.name] == []
