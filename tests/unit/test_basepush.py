"""The demo base's API push (demo/basepush.py) without an engine: the save stream's layers compressed by pigz, each
named by the sha256 of its uncompressed bytes (the diff_id), the same bytes giving the same blob; the checks refuse
a config that is not the image's and a layer the image names but the stream lacks."""
from __future__ import annotations

import gzip
import hashlib
import io
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import PublishError
from demo import basepush

pytestmark = pytest.mark.skipif(shutil.which("pigz") is None, reason="pigz is not installed")


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


LAYERS = [_tar({"etc/os-release": b"demo\n" * 1000}), _tar({"opt/venv/x.py": bytes(range(256)) * 4000})]
CONFIG = b'{"rootfs": "demo"}'
IMAGE_ID = "sha256:" + hashlib.sha256(CONFIG).hexdigest()
DIFF_IDS = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in LAYERS]


class Api:
    def get_image(self, image: str, chunk_size: int) -> Iterator[bytes]:
        data = _tar({"b" * 64 + "/layer.tar": LAYERS[1], "a" * 64 + "/layer.tar": LAYERS[0],
                     IMAGE_ID.removeprefix("sha256:") + ".json": CONFIG, "manifest.json": b"[]"})
        return iter([data[i:i + 1000] for i in range(0, len(data), 1000)])


class Client:
    api = Api()


def test_layers_by_diff_id_and_the_same_blob_twice(tmp_path: Path) -> None:
    client: Any = Client()
    config, layers = basepush._blobs(client, IMAGE_ID, tmp_path / "one")
    assert config == CONFIG and sorted(layers) == sorted(DIFF_IDS)
    for layer, diff_id in zip(LAYERS, DIFF_IDS):
        digest, size, path = layers[diff_id]
        assert gzip.decompress(path.read_bytes()) == layer and path.stat().st_size == size
        assert digest == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    again = basepush._blobs(client, IMAGE_ID, tmp_path / "two")[1]
    assert {d: v[0] for d, v in again.items()} == {d: v[0] for d, v in layers.items()}
    basepush.check("demo/base:t", IMAGE_ID, DIFF_IDS, config, layers)


def test_a_config_not_the_images_is_refused(tmp_path: Path) -> None:
    client: Any = Client()
    config, layers = basepush._blobs(client, IMAGE_ID, tmp_path)
    with pytest.raises(PublishError, match="does not hash to the image ID"):
        basepush.check("demo/base:t", IMAGE_ID, DIFF_IDS, config + b" ", layers)


def test_a_layer_the_stream_lacks_is_refused(tmp_path: Path) -> None:
    client: Any = Client()
    config, layers = basepush._blobs(client, IMAGE_ID, tmp_path)
    other = "sha256:" + hashlib.sha256(b"another layer").hexdigest()
    with pytest.raises(PublishError, match=f"no saved layer hashes to diff_id {other}"):
        basepush.check("demo/base:t", IMAGE_ID, [DIFF_IDS[0], other], config, layers)
