"""Post-build normalisation: the same pins on the same base give the same image ID and manifest digest.

The classic builder stamps wall-clock times into the layers it adds (file mtimes) and into the config
(`created`, history, the build container's ID). This module reads the image back from the engine
(`docker save`), rewrites only the layers the build added, and writes a Docker schema-2 image:
- tar entries in path order, mtime clamped to the source date, uname/gname empty, only xattrs kept;
- each added layer gzip-compressed here (level 6, header mtime 0, no file name);
- config `created` and the added history entries at the source date; `container`, `container_config`,
  `docker_version` and the parent `config.Image` dropped;
- base layers are never rewritten: their registry descriptors come from the base manifest.
The result is loaded into the engine (`docker load`), so the local image ID equals the config digest,
and kept as blobs under `<cache>/oci/` for the registry push (builder/engine/staging.py).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from builder.core import files as fs
from builder.core import log
from builder.core.errors import BuildFailed
from builder.core.files import sha256_file
from builder.core.options import Settings

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
GZIP_LEVEL = 6
PER_BUILD_KEYS = ("container", "container_config", "docker_version")
CHUNK = 1 << 20


@dataclass(frozen=True)
class Descriptor:
    mediaType: str  # noqa: N815 (the registry's spelling)
    size: int
    digest: str


@dataclass
class Normalized:
    """What normalisation made of one engine build."""
    image_id: str            # = config digest, also the local image ID after load
    manifest_digest: str
    raw_image_id: str        # what the engine built
    source_date_epoch: int
    base_layers: int
    layers: list[dict]      # descriptors, base first
    diff_ids: list[str]
    seconds: float


def store(settings: Settings, *parts: str) -> Path:
    return settings.cache("oci", *parts)


def blob_path(settings: Settings, digest: str) -> Path:
    return store(settings, "blobs", "sha256") / digest.removeprefix("sha256:")


def iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_of(created: str) -> int:
    """'2025-01-03T14:00:00Z' (the rendered created label) -> unix seconds."""
    try:
        return int(datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())
    except ValueError:
        raise BuildFailed(f"label org.opencontainers.image.created: expected YYYY-MM-DDTHH:MM:SSZ, got {created!r}") from None


class _Chunks:
    """A read()-able view of an iterator of byte chunks (the engine's save stream)."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks, self.buf, self.pos = chunks, b"", 0

    def read(self, size: int = -1) -> bytes:
        if self.pos >= len(self.buf):
            self.buf, self.pos = next(self.chunks, b""), 0
        if size < 0 or size >= len(self.buf) - self.pos:
            out = self.buf[self.pos:]
            self.pos = len(self.buf)
            while size < 0 or len(out) < size:  # short reads are fine for tarfile, but fill small asks
                more = next(self.chunks, b"")
                if not more:
                    break
                need = len(more) if size < 0 else size - len(out)
                out += more[:need]
                self.buf, self.pos = more, need
            return out
        out = self.buf[self.pos:self.pos + size]
        self.pos += size
        return out


class _Hashing:
    """A write-only file that hashes and counts what passes through to `out` (or nowhere)."""

    def __init__(self, out: IO[bytes] | gzip.GzipFile | None = None):
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        if self.out is not None:
            self.out.write(data)
        return len(data)

    def flush(self) -> None:
        if self.out is not None:
            self.out.flush()

    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


def save_layers(client: Any, image_id: str, wanted: set[str], work: Path) -> tuple[dict[str, Path], bytes]:
    """Stream `docker save`; keep the layer tars whose sha256 (diff ID) is in `wanted`; return them and
    the raw config bytes. Layers not wanted are hashed and dropped."""
    found: dict[str, Path] = {}
    config = b""
    stream = _Chunks(iter(client.api.get_image(image_id, chunk_size=CHUNK)))
    with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            if member.name.endswith("/layer.tar"):
                src = tar.extractfile(member)
                assert src is not None
                fd, tmp = tempfile.mkstemp(dir=work, suffix=".tar")
                with os.fdopen(fd, "wb") as out:
                    hashing = _Hashing(out)
                    shutil.copyfileobj(src, hashing, CHUNK)
                if hashing.digest() in wanted:
                    found[hashing.digest()] = Path(tmp)
                else:
                    os.unlink(tmp)
            elif member.name == f"{image_id.removeprefix('sha256:')}.json":
                src = tar.extractfile(member)
                config = src.read() if src else b""
    return found, config


def _key(name: str) -> list[str]:
    return [p for p in name.split("/") if p not in ("", ".")]


def normalize_layer(src: Path, out: IO[bytes], epoch: int) -> tuple[str, int]:
    """Rewrite one layer tar deterministically into gzip `out`; return (diff ID, uncompressed size)."""
    with tarfile.open(src) as tar:
        members = sorted(tar.getmembers(), key=lambda m: _key(m.name))
        first_of: dict[str, str] = {}   # hard-link groups: the first name in path order carries the data
        order = {m.name: i for i, m in enumerate(members)}
        groups: dict[str, list[str]] = {}
        for m in members:
            if m.islnk():
                groups.setdefault(m.linkname, [m.linkname]).append(m.name)
        for names in groups.values():
            names.sort(key=lambda n: order.get(n, -1))
            for n in names:
                first_of[n] = names[0]
        by_name = {m.name: m for m in members}
        gz = gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=out, mtime=0)
        plain = _Hashing(gz)
        with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as new:  # type: ignore[call-overload]
            for m in members:
                data_from = m
                info = tarfile.TarInfo(m.name)
                info.mode, info.uid, info.gid = m.mode, m.uid, m.gid
                info.mtime = min(int(m.mtime), epoch)
                info.uname = info.gname = ""
                info.devmajor, info.devminor = m.devmajor, m.devminor
                info.pax_headers = {k: v for k, v in m.pax_headers.items() if k.startswith("SCHILY.xattr.")}
                head = first_of.get(m.name)
                if head is not None and head != m.name:       # a later name of a hard-link group
                    info.type, info.linkname = tarfile.LNKTYPE, head
                elif head == m.name and m.islnk():            # the group's first name carries the data
                    data_from = by_name[m.linkname]
                    info.type, info.size = tarfile.REGTYPE, data_from.size
                else:
                    info.type, info.linkname, info.size = m.type, m.linkname, m.size if m.isreg() else 0
                if info.isreg():
                    new.addfile(info, tar.extractfile(data_from))
                else:
                    new.addfile(info)
        gz.close()
    return plain.digest(), plain.size


def _write_blob(settings: Settings, data: bytes) -> Descriptor:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = blob_path(settings, digest)
    if not path.exists():
        fs.write_atomic(path, data)  # a private temporary name: concurrent writers of one blob never mix
    return Descriptor("", len(data), digest)


def fixed_config(raw: dict, base_history: int, diff_ids: list[str], epoch: int) -> bytes:
    """The engine's config with nothing per-build left: fixed times, no build container, new diff IDs."""
    config = {k: v for k, v in raw.items() if k not in PER_BUILD_KEYS}
    config["created"] = iso(epoch)
    config["config"] = dict(config.get("config") or {}, Image="", Hostname="")
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    history = [dict(h) for h in config.get("history") or []]
    for entry in history[base_history:]:
        entry["created"] = iso(epoch)
    config["history"] = history
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def manifest_bytes(config: Descriptor, layers: list[Descriptor]) -> bytes:
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
           "config": {"mediaType": CONFIG_TYPE, "size": config.size, "digest": config.digest},
           "layers": [asdict(d) for d in layers]}
    return json.dumps(doc, indent=3).encode()


def load(client: Any, config: bytes, layer_files: list[Path | None], tag: str, tmp_dir: Path) -> None:
    """`docker load` of a save-format tar. Layers the engine already has (base) are not read by the
    engine, so they travel as empty placeholders; the image ID is the sha256 of `config`."""
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    with tempfile.TemporaryFile(dir=tmp_dir) as fh:
        with tarfile.open(fileobj=fh, mode="w") as tar:
            names = []
            for i, path in enumerate(layer_files):
                names.append(f"{i:03d}/layer.tar")
                _add(tar, names[-1], b"", path)
            _add(tar, config_name, config)
            _add(tar, "manifest.json", json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": names}]).encode())
        fh.seek(0)
        try:
            for _ in client.api.load_image(fh):
                pass
        except Exception as exc:  # docker.errors.APIError: a layer it did not have, a bad tar
            raise BuildFailed(f"docker load of the normalised {tag}: {str(exc)[:300]}") from None


def _add(tar: tarfile.TarFile, name: str, data: bytes, path: Path | None = None) -> None:
    info = tarfile.TarInfo(name)
    info.size = path.stat().st_size if path is not None else len(data)
    with open(path, "rb") if path is not None else io.BytesIO(data) as src:
        tar.addfile(info, src)


def normalize(client: Any, raw_image_id: str, tag: str, base_config: dict, base_layers: list[dict],
              epoch: int, settings: Settings) -> Normalized:
    """Normalise the image the engine built on top of the base (config + manifest layer descriptors
    from the registry); load it as `tag`; return the record. Cached by raw image ID."""
    record_path = store(settings, "records") / f"{raw_image_id.removeprefix('sha256:')}-{epoch}.json"
    if record_path.exists():
        cached = Normalized(**json.loads(record_path.read_text()))
        if blob_path(settings, cached.manifest_digest).exists() and _retag(client, cached.image_id, tag):
            return cached
    start = time.monotonic()
    attrs = client.api.inspect_image(raw_image_id)
    diff_ids: list[str] = list(attrs["RootFS"]["Layers"])
    base_ids: list[str] = list(base_config["rootfs"]["diff_ids"])
    if diff_ids[: len(base_ids)] != base_ids or len(base_layers) != len(base_ids):
        raise BuildFailed(f"{tag}: the built image does not start with the base image's layers")
    added = diff_ids[len(base_ids):]
    fs.sweep_parts(store(settings, "tmp"))  # what a killed run left
    fs.sweep_parts(store(settings, "blobs", "sha256"))
    work = fs.part_dir(store(settings, "tmp"), "normalise")
    try:
        with log.step(f"normalise {len(added)} added layers"):
            raw_tars, raw_config = save_layers(client, raw_image_id, set(added), work)
            missing = [d for d in added if d not in raw_tars]
            if missing or not raw_config:
                raise BuildFailed(f"{tag}: docker save lacked {missing or 'the config'}")
            new_ids, descriptors, files = list(base_ids), [Descriptor(**d) for d in base_layers], []
            for diff_id in added:
                tmp = work / "layer.gz"
                with open(tmp, "wb") as out:
                    new_id, _ = normalize_layer(raw_tars[diff_id], out, epoch)
                digest = "sha256:" + sha256_file(tmp)
                dest = blob_path(settings, digest)
                tmp.replace(dest)
                new_ids.append(new_id)
                descriptors.append(Descriptor(LAYER_TYPE, dest.stat().st_size, digest))
                files.append(dest)
            config = fixed_config(json.loads(raw_config), len(base_config.get("history") or []), new_ids, epoch)
            config_desc = _write_blob(settings, config)
            manifest = manifest_bytes(Descriptor(CONFIG_TYPE, config_desc.size, config_desc.digest), descriptors)
            manifest_desc = _write_blob(settings, manifest)
        with log.step(f"docker load {config_desc.digest[:19]}"):
            load(client, config, [None] * len(base_ids) + files, tag, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not _loaded(client, config_desc.digest, tag):
        raise BuildFailed(f"{tag}: after docker load the engine does not show image {config_desc.digest} under the tag")
    result = Normalized(image_id=config_desc.digest, manifest_digest=manifest_desc.digest, raw_image_id=raw_image_id,
                        source_date_epoch=epoch, base_layers=len(base_ids), layers=[asdict(d) for d in descriptors],
                        diff_ids=new_ids, seconds=round(time.monotonic() - start, 3))
    fs.write_atomic(record_path, json.dumps(asdict(result), indent=2) + "\n")
    return result


def _retag(client: Any, image_id: str, tag: str) -> bool:
    """Point `tag` at an image the engine already has (the build just moved the tag to its raw image)."""
    import docker

    try:
        client.api.inspect_image(image_id)
    except docker.errors.ImageNotFound:
        return False
    repository, _, name = tag.rpartition(":")
    return bool(client.api.tag(image_id, repository, name, force=True))


def _loaded(client: Any, image_id: str, tag: str) -> bool:
    import docker

    try:
        attrs = client.api.inspect_image(tag)
    except docker.errors.ImageNotFound:
        return False
    return bool(attrs.get("Id") == image_id)
