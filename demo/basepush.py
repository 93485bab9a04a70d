"""The demo base's push through the registry API, its layers compressed by pigz on every core.

`docker push` compresses with Go's gzip at its default level on one core and has no option to change that. Here
the engine's own layer streams (`docker save`, read as it arrives) go through `pigz -n -LEVEL` (no name, no time:
the same bytes give the same blob), each checked against the image's diff_id; the blobs, the config (the image ID's
bytes) and a schema-2 manifest go up through the registry API. Then the engine pulls that digest: it already holds
an image with that config, so it fetches the manifest only and records the repo digest a `FROM base@sha256` build
needs (the pull's seconds are timed as their own step).

That pull leaves the engine without its own record of which blob holds each base layer, so the first build's raw
push (builder/engine/normalize.py) would upload the whole base again, gzip on one core (33.8 s measured). `behind`
starts the engine's own push of the base to that raw repository in a thread, beside the steps up to that build;
the build's raw push then finds every base layer already known (the engine shares one upload per layer).
"""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from builder.core import log
from builder.core.errors import InfraError, PublishError
from builder.core.options import Settings
from builder.engine import client as engine
from builder.engine.registry import Registry, split_repository

LEVEL = 1  # benchmarks/README.md: pigz -1 against -6 and docker push on this base
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
CHUNK = 1 << 20


class _Stream(io.RawIOBase):
    """A file over the engine's chunk iterator, for tarfile's stream mode."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks, self.rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        while not self.rest:
            self.rest = next(self.chunks, b"")
            if not self.rest:
                return 0
        n = min(len(buf), len(self.rest))
        buf[:n], self.rest = self.rest[:n], self.rest[n:]
        return n


def _compress(src: IO[bytes], out: Path) -> tuple[str, str, int]:
    """(diff_id, blob digest, blob size) of src compressed by pigz into out."""
    pigz = shutil.which("pigz")
    if pigz is None:
        raise InfraError("pigz: not installed; `builder setup` installs it (apt-get install pigz)")
    raw, packed = hashlib.sha256(), hashlib.sha256()
    with open(out, "wb") as fh, subprocess.Popen([pigz, "-n", f"-{LEVEL}", "-c"], stdin=subprocess.PIPE,
                                                 stdout=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None  # both PIPE

        def drain(stdout: IO[bytes]) -> None:
            while data := stdout.read(CHUNK):
                packed.update(data)
                fh.write(data)

        reader = threading.Thread(target=drain, args=(proc.stdout,))
        reader.start()
        try:
            while data := src.read(CHUNK):
                raw.update(data)
                proc.stdin.write(data)
        finally:
            proc.stdin.close()
            reader.join()
        if proc.wait() != 0:
            raise PublishError(f"pigz exited {proc.returncode} compressing a base layer")
    return f"sha256:{raw.hexdigest()}", f"sha256:{packed.hexdigest()}", out.stat().st_size


def _blobs(client: engine.Client, image_id: str, work: Path) -> tuple[bytes, dict[str, tuple[str, int, Path]]]:
    """(config bytes, {diff_id: (digest, size, path)}) from the engine's save stream of image_id."""
    config, layers = b"", dict[str, tuple[str, int, Path]]()
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BufferedReader(_Stream(iter(client.api.get_image(image_id, CHUNK))), CHUNK),
                      mode="r|") as tar:
        for member in tar:
            src = tar.extractfile(member) if member.isfile() else None
            if src is None:
                continue
            if member.name.endswith("/layer.tar"):
                path = work / f"layer-{len(layers)}.gz"
                diff_id, digest, size = _compress(src, path)
                layers[diff_id] = (digest, size, path)
            elif member.name == image_id.removeprefix("sha256:") + ".json":
                config = src.read()
    return config, layers


def check(where: str, image_id: str, diff_ids: list[str], config: bytes,
          layers: dict[str, tuple[str, int, Path]]) -> None:
    """PublishError unless the saved config is the image's (its bytes hash to the image ID) and every diff_id of
    the image has a compressed layer whose uncompressed bytes hash to it."""
    if hashlib.sha256(config).hexdigest() != image_id.removeprefix("sha256:"):
        raise PublishError(f"{where}: the saved config does not hash to the image ID {image_id}")
    missing = [d for d in diff_ids if d not in layers]
    if missing:
        raise PublishError(f"{where}: no saved layer hashes to diff_id {missing[0]}")


def push(client: engine.Client, settings: Settings, repository: str, tag: str, work: Path) -> str:
    """Push `repository:tag` from the engine; return `repository@sha256:...`, which the engine then knows."""
    image = client.images.get(f"{repository}:{tag}")
    diff_ids: list[str] = image.attrs["RootFS"]["Layers"]
    host, name = split_repository(repository)
    reg = Registry.from_settings(host, settings)
    try:
        with log.step(f"base: push: save + pigz -{LEVEL}"):
            config, layers = _blobs(client, image.id, work)
        check(f"{repository}:{tag}", image.id, diff_ids, config, layers)
        with log.step("base: push: upload"):
            for diff_id in diff_ids:
                digest, _, path = layers[diff_id]
                if not reg.has_blob(name, digest):
                    reg.upload_blob(name, digest, str(path))
            (work / "config.json").write_bytes(config)
            if not reg.has_blob(name, image.id):
                reg.upload_blob(name, image.id, str(work / "config.json"))
            body = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                               "config": {"mediaType": CONFIG, "size": len(config), "digest": image.id},
                               "layers": [{"mediaType": LAYER, "size": layers[d][1], "digest": layers[d][0]}
                                          for d in diff_ids]}, indent=3).encode()
            digest = reg.put_manifest(name, tag, body, MANIFEST)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ref = f"{repository}@{digest}"
    with log.step("base: push: engine pulls the digest (manifest only)"):
        if not engine.pull_by_digest(client, ref):
            raise PublishError(f"{ref}: pushed, but the engine could not pull it back by digest")
    return ref


def behind(settings: Settings, image_id: str, host: str) -> threading.Thread:
    """The engine's own push of the base to `<host>/builder-raw/layers`, started in a thread (joined by the caller
    or at exit); a failure is one line: the first build's raw push then uploads the layers itself."""
    from builder.engine import normalize  # lazy: the normaliser is heavy

    def push() -> None:
        start = time.monotonic()
        try:
            normalize.raw_manifest_via_registry(engine.connect(settings, timeout=600), image_id, host, settings)
            log.info(f"base: the engine's own push of the base layers (beside the next steps) took "
                     f"{time.monotonic() - start:.1f} s")
        except Exception as exc:  # the build's raw push does the same work; this only moves it earlier
            log.info(f"base: the engine's own push of the base layers failed ({str(exc)[:200]}); "
                     "the first build's raw push uploads them")

    thread = threading.Thread(target=push, name="base-engine-push")
    thread.start()
    return thread
