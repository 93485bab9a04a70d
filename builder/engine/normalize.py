"""Post-build normalisation: the same pins on the same base give the same image ID and manifest digest.

The classic builder stamps wall-clock times into the layers it adds (file mtimes) and into the config
(`created`, history, the build container's ID). This module rewrites only the layers the build added,
and writes a Docker schema-2 image:
- tar entries in path order, mtime clamped to that layer's source date (the commit time of what it
  installs), uname/gname empty, only xattrs kept;
- each added layer gzip-compressed here (level 6, header mtime 0, no file name), layers in parallel;
- config `created` at the newest layer date, each added history entry at its layer's date;
  `container`, `container_config`, `docker_version`, the parent `config.Image` and the run's cache-key
  label (builder/image/templates: it only keeps another run's layers out of this run's cache) dropped;
- base layers are never read or rewritten: their registry descriptors come from the base manifest.
The base is never read back: the engine pushes the raw image to `<base registry>/builder-raw/layers`
(it uploads only the layers that registry lacks) and only added layers are downloaded from there.
A raw layer normalised once (by diff ID and date) is never normalised again (`<cache>/oci/layers/`).
The result is loaded into the engine (`docker load`; layers it already has travel as placeholders), so
the local image ID equals the config digest, and kept as blobs under `<cache>/oci/` for the registry
push (builder/engine/staging.py). benchmarks/bench_build.py compares this with `docker save` (source
"save", kept for that comparison: it reads the whole image, base included).
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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from builder.core import files as fs
from builder.core import log
from builder.core.constants import CACHE_KEY_LABEL
from builder.core.errors import BuildFailed
from builder.core.imageref import ImageRef, digest_of, hex_of
from builder.core.options import Settings
from builder.engine.registry import Registry
from builder.engine.registry import auth_config as registry_auth_config

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
GZIP_LEVEL = 6
PER_BUILD_KEYS = ("container", "container_config", "docker_version")
CHUNK = 1 << 20
SOURCES = ("registry", "save")
RAW_REPOSITORY = "builder-raw/layers"
RECENT_RECORDS = 16  # normalised images looked at for layers the engine already has


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
    layers: list[dict[str, Any]]      # descriptors, base first
    diff_ids: list[str]
    seconds: float
    layer_epochs: list[int] = field(default_factory=list)  # source date of each added layer
    reused: int = 0          # added layers whose normalised blob came from the layer cache
    times: dict[str, float] = field(default_factory=dict)  # push_raw/save, normalise, load
    cached: bool = False     # this run reused the stored record: `seconds` is this run's lookup and retag


def store(settings: Settings, *parts: str) -> Path:
    return settings.cache("oci", *parts)


def blob_path(settings: Settings, digest: str) -> Path:
    return store(settings, "blobs", "sha256") / hex_of(digest)


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
        return digest_of(self.sha)


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
            elif member.name == f"{hex_of(image_id)}.json":
                src = tar.extractfile(member)
                config = src.read() if src else b""
    return found, config


def _key(name: str) -> list[str]:
    return [p for p in name.split("/") if p not in ("", ".")]


def normalize_layer(src: Path, out: IO[bytes] | _Hashing, epoch: int) -> tuple[str, int]:
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
    digest = digest_of(data)
    path = blob_path(settings, digest)
    if not path.exists():
        fs.write_atomic(path, data)  # a private temporary name: concurrent writers of one blob never mix
    return Descriptor("", len(data), digest)


def fixed_config(raw: dict[str, Any], base_history: int, diff_ids: list[str], epochs: int | list[int]) -> bytes:
    """The engine's config with nothing per-build left: fixed times (each added layer's history entry at
    its layer's date, entries without a layer and `created` at the newest), no build container, no
    cache-key label, new diff IDs."""
    config = {k: v for k, v in raw.items() if k not in PER_BUILD_KEYS}
    inner = dict(config.get("config") or {}, Image="", Hostname="")
    if CACHE_KEY_LABEL in (inner.get("Labels") or {}):
        inner["Labels"] = {k: v for k, v in inner["Labels"].items() if k != CACHE_KEY_LABEL}
    config["config"] = inner
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    history = [dict(h) for h in config.get("history") or []]
    per_layer = [epochs] * len(history) if isinstance(epochs, int) else list(epochs)
    newest = max(per_layer, default=0)
    config["created"] = iso(newest)
    kept, layer = history[:base_history], 0
    for entry in history[base_history:]:
        if f"LABEL {CACHE_KEY_LABEL}=" in entry.get("created_by", ""):
            continue
        if entry.get("empty_layer"):
            entry["created"] = iso(newest)
        else:
            entry["created"] = iso(per_layer[layer] if layer < len(per_layer) else newest)
            layer += 1
        kept.append(entry)
    config["history"] = kept
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


def layer_record(settings: Settings, raw_diff_id: str, epoch: int) -> Path:
    """Where the normalised form of one raw layer (at one epoch) is remembered."""
    return store(settings, "layers") / f"{hex_of(raw_diff_id)}-{epoch}.json"


def cached_layer(settings: Settings, raw_diff_id: str, epoch: int) -> dict[str, Any] | None:
    """{diff_id, digest, size} of a raw layer normalised before, when its blob is still in the store."""
    path = layer_record(settings, raw_diff_id, epoch)
    if not path.exists():
        return None
    entry: dict[str, Any] = json.loads(path.read_text())
    blob = blob_path(settings, entry["digest"])
    return entry if blob.exists() and blob.stat().st_size == entry["size"] else None


def normalise_one(src: Path, epoch: int, raw_diff_id: str, settings: Settings, work: Path) -> dict[str, Any]:
    """Normalise one raw layer tar into the blob store; remember it by its raw diff ID and epoch."""
    fd, tmp = tempfile.mkstemp(dir=work, suffix=".gz")
    with os.fdopen(fd, "wb") as out:
        hashing = _Hashing(out)
        diff_id, _ = normalize_layer(src, hashing, epoch)
    os.replace(tmp, blob_path(settings, hashing.digest()))
    entry = {"diff_id": diff_id, "digest": hashing.digest(), "size": hashing.size}
    record = layer_record(settings, raw_diff_id, epoch)
    tmp_record = work / f"{record.name}.tmp"  # this run's own: another run may write the same record
    tmp_record.write_text(json.dumps(entry) + "\n")
    tmp_record.replace(record)
    return entry


def raw_hold_path(settings: Settings, tag: str) -> Path:
    """The lock a run holds on its raw image's manifest in the local registry (builder-raw/layers:<tag>)."""
    return store(settings, "held") / f"raw-{tag[:64]}.lock"


def raw_manifest_via_registry(client: Any, raw_image_id: str, host: str, settings: Settings) -> dict[str, Any]:
    """Push the engine's image to `<host>/builder-raw/layers` (the engine uploads only the layers that
    registry lacks: base layers are mounted or present) and return the manifest it pushed."""
    import docker  # lazy: the docker SDK is heavy

    repository, name = f"{host}/{RAW_REPOSITORY}", hex_of(raw_image_id)
    fs.hold(raw_hold_path(settings, name))  # this run reads its layers back: `builder gc` spares the manifest
    auth_config = registry_auth_config(host, settings)  # that host's own credentials only
    tagged = bool(client.api.inspect_image(raw_image_id).get("RepoTags"))
    if not client.api.tag(raw_image_id, repository, name, force=True):
        raise BuildFailed(f"{repository}:{name}: the engine refused to tag {raw_image_id}")
    try:
        for item in client.api.push(repository, tag=name, stream=True, decode=True, auth_config=auth_config):
            if "error" in item:
                raise BuildFailed(f"docker push {repository}:{name[:12]} (raw layers): {str(item['error'])[:300]}")
    except docker.errors.APIError as err:
        raise BuildFailed(f"docker push {repository}:{name[:12]} (raw layers): {str(err)[:300]}") from None
    finally:  # only the tag, and only when another one keeps the raw image (the build cache's last step)
        if tagged:
            client.api.remove_image(f"{repository}:{name}", noprune=True)
    manifest: dict[str, Any] = json.loads(Registry.from_settings(host, settings).manifest(RAW_REPOSITORY, name)["content"])
    return manifest


def fetch_raw_layer(reg: Registry, digest: str, diff_id: str, work: Path) -> Path:
    """Download one pushed (gzip) layer and unpack it; its tar must hash to `diff_id`."""
    fd, gz_path = tempfile.mkstemp(dir=work, suffix=".gz")
    with os.fdopen(fd, "wb") as out:
        reg.download_blob(RAW_REPOSITORY, digest, out)
    fd, tar_path = tempfile.mkstemp(dir=work, suffix=".tar")
    with gzip.open(gz_path, "rb") as src, os.fdopen(fd, "wb") as out:
        hashing = _Hashing(out)
        shutil.copyfileobj(src, hashing, CHUNK)
    os.unlink(gz_path)
    if hashing.digest() != diff_id:
        raise BuildFailed(f"raw layer {digest} unpacks to {hashing.digest()}, the engine names it {diff_id}")
    return Path(tar_path)


def _epochs(epochs: int | list[int], count: int, tag: str) -> list[int]:
    if isinstance(epochs, int):
        return [epochs] * count
    if len(epochs) != count:
        raise BuildFailed(f"{tag}: the build added {count} layers, the render planned {len(epochs)} layer times")
    return list(epochs)


def stored_image(settings: Settings, image_id: str) -> tuple[bytes, list[Path | None]] | None:
    """(config bytes, each layer's gzip blob in the store or None) of an image this cache normalised; None when
    the store has no record of it. Base layers are never in the store (they stay in the base's registry)."""
    config = blob_path(settings, image_id)
    if not config.is_file():
        return None
    records = sorted(store(settings, "records").glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in records:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("image_id") != image_id or not blob_path(settings, record["manifest_digest"]).is_file():
            continue
        manifest = json.loads(blob_path(settings, record["manifest_digest"]).read_bytes())
        blobs = [blob_path(settings, d["digest"]) for d in manifest.get("layers", [])]
        return config.read_bytes(), [b if b.is_file() else None for b in blobs]
    return None


def present_prefix(client: Any, diff_ids: list[str], at_least: int, settings: Settings) -> int:
    """How many leading layers of `diff_ids` the engine already has (a recently normalised image
    shares them), so `docker load` need not read them again."""
    import docker  # lazy: the docker SDK is heavy

    best = at_least
    records = sorted(store(settings, "records").glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in records[:RECENT_RECORDS]:
        theirs = json.loads(path.read_text()).get("diff_ids", [])
        common = next((i for i, (a, b) in enumerate(zip(theirs, diff_ids, strict=False)) if a != b),
                      min(len(theirs), len(diff_ids)))
        if common <= best:
            continue
        try:
            layers = client.api.inspect_image(json.loads(path.read_text())["image_id"])["RootFS"]["Layers"]
        except docker.errors.ImageNotFound:
            continue
        if layers[:common] == diff_ids[:common]:
            best = common
    return best


def normalize(client: Any, raw_image_id: str, tag: str, base_config: dict[str, Any], base_layers: list[dict[str, Any]],
              epochs: int | list[int], settings: Settings, registry_host: str | None = None,
              source: str = "registry") -> Normalized:
    """Normalise what the engine built on top of the base (config + manifest layer descriptors from the
    registry); load it as `tag`; return the record. `epochs`: one source date per added layer (or one
    for all). Only added layers whose raw diff ID was never normalised at its epoch are read: through
    the registry at `registry_host` (source "registry": the engine pushes only what it lacks) or by
    `docker save` (source "save", reads the whole image). Cached by raw image ID and epochs."""
    if source not in SOURCES:
        raise BuildFailed(f"normalise source {source!r}: expected one of {', '.join(SOURCES)}")
    start = time.monotonic()
    attrs = client.api.inspect_image(raw_image_id)
    diff_ids: list[str] = list(attrs["RootFS"]["Layers"])
    base_ids: list[str] = list(base_config["rootfs"]["diff_ids"])
    if diff_ids[: len(base_ids)] != base_ids or len(base_layers) != len(base_ids):
        raise BuildFailed(f"{tag}: the built image does not start with the base image's layers")
    added = diff_ids[len(base_ids):]
    per_layer = _epochs(epochs, len(added), tag)
    key = hashlib.sha256(json.dumps(per_layer).encode()).hexdigest()[:16]
    record_path = store(settings, "records") / f"{hex_of(raw_image_id)}-{key}.json"
    if record_path.exists():
        cached = Normalized(**json.loads(record_path.read_text()))
        if blob_path(settings, cached.manifest_digest).exists() and _retag(client, cached.image_id, tag):
            return replace(cached, seconds=round(time.monotonic() - start, 3), times={}, cached=True)
    times: dict[str, float] = {}
    entries: dict[int, dict[str, Any]] = {}
    for i, diff_id in enumerate(added):
        hit = cached_layer(settings, diff_id, per_layer[i])
        if hit is not None:
            entries[i] = hit
    todo = [i for i in range(len(added)) if i not in entries]
    fs.sweep_parts(store(settings, "tmp"))  # what a killed run left
    fs.sweep_parts(store(settings, "blobs", "sha256"))
    work = fs.part_dir(store(settings, "tmp"), "normalise")
    try:
        with log.step(f"normalise {len(todo)} of {len(added)} added layers ({source})"):
            raw_config, jobs = _raw_layer_jobs(client, raw_image_id, diff_ids, len(base_ids), todo, registry_host, source,
                                   settings, work, times)
            mark = time.monotonic()
            workers = max(1, min(len(todo), os.cpu_count() or 1))
            with ThreadPoolExecutor(max_workers=workers) as pool:  # zlib releases the GIL: layers compress at once
                done = pool.map(lambda i: normalise_one(jobs[i](), per_layer[i], added[i], settings, work), todo)
                entries.update(zip(todo, done, strict=True))
            times["normalise"] = round(time.monotonic() - mark, 3)
            new_ids = base_ids + [entries[i]["diff_id"] for i in range(len(added))]
            descriptors = [Descriptor(**d) for d in base_layers]
            descriptors += [Descriptor(LAYER_TYPE, entries[i]["size"], entries[i]["digest"]) for i in range(len(added))]
            config = fixed_config(raw_config, len(base_config.get("history") or []), new_ids, per_layer)
            config_desc = _write_blob(settings, config)
            manifest = manifest_bytes(Descriptor(CONFIG_TYPE, config_desc.size, config_desc.digest), descriptors)
            manifest_desc = _write_blob(settings, manifest)
        mark = time.monotonic()
        present = present_prefix(client, new_ids, len(base_ids), settings)
        files: list[Path | None] = [None] * present
        files += [blob_path(settings, d.digest) for d in descriptors[present:]]
        with log.step(f"docker load {config_desc.digest[:19]} ({len(new_ids) - present} layers read)"):
            load(client, config, files, tag, work)
        times["load"] = round(time.monotonic() - mark, 3)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not _loaded(client, config_desc.digest, tag):
        raise BuildFailed(f"{tag}: after docker load the engine does not show image {config_desc.digest} under the tag")
    result = Normalized(image_id=config_desc.digest, manifest_digest=manifest_desc.digest, raw_image_id=raw_image_id,
                        source_date_epoch=max(per_layer, default=0), base_layers=len(base_ids),
                        layers=[asdict(d) for d in descriptors], diff_ids=new_ids,
                        seconds=round(time.monotonic() - start, 3), layer_epochs=per_layer,
                        reused=len(added) - len(todo), times=times)
    fs.write_atomic(record_path, json.dumps(asdict(result), indent=2) + "\n")
    return result


def _raw_layer_jobs(client: Any, raw_image_id: str, diff_ids: list[str], base: int, todo: list[int],
                    host: str | None, source: str, settings: Settings, work: Path,
                    times: dict[str, float]) -> tuple[dict[str, Any], dict[int, Callable[[], Path]]]:
    """The engine's config of the raw image, and index -> a callable giving that added layer's raw tar
    (download and unpack run in the pool)."""
    mark = time.monotonic()
    if source == "save":
        tars, config = save_layers(client, raw_image_id, {diff_ids[base + i] for i in todo}, work)
        times["save"] = round(time.monotonic() - mark, 3)
        missing = [diff_ids[base + i] for i in todo if diff_ids[base + i] not in tars]
        if missing or not config:
            raise BuildFailed(f"docker save of {raw_image_id[:19]} lacked {missing or 'the config'}")
        return json.loads(config), {i: (lambda d=diff_ids[base + i]: tars[d]) for i in todo}  # type: ignore[misc]
    if host is None:
        raise BuildFailed("normalise through the registry needs the base image's registry host")
    manifest = raw_manifest_via_registry(client, raw_image_id, host, settings)
    times["push_raw"] = round(time.monotonic() - mark, 3)
    layers = manifest.get("layers") or []
    if len(layers) != len(diff_ids):
        raise BuildFailed(f"{RAW_REPOSITORY}: the engine pushed {len(layers)} layers of {raw_image_id[:19]}, "
                          f"it has {len(diff_ids)}")
    reg = Registry.from_settings(host, settings)
    config = reg.blob(RAW_REPOSITORY, manifest["config"]["digest"])  # hash-checked
    if manifest["config"]["digest"] != raw_image_id:
        raise BuildFailed(f"{RAW_REPOSITORY}: the engine pushed config {manifest['config']['digest']} for {raw_image_id}")
    def job(i: int) -> Callable[[], Path]:
        return lambda: fetch_raw_layer(reg, layers[base + i]["digest"], diff_ids[base + i], work)

    return json.loads(config), {i: job(i) for i in todo}


def _retag(client: Any, image_id: str, tag: str) -> bool:
    """Point `tag` at an image the engine already has (the build just moved the tag to its raw image)."""
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        client.api.inspect_image(image_id)
    except docker.errors.ImageNotFound:
        return False
    ref = ImageRef(tag)
    return bool(client.api.tag(image_id, ref.name, ref.tag, force=True))


def _loaded(client: Any, image_id: str, tag: str) -> bool:
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        attrs = client.api.inspect_image(tag)
    except docker.errors.ImageNotFound:
        return False
    return bool(attrs.get("Id") == image_id)
