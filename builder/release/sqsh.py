"""`builder export-sqsh`: the accepted image as an enroot squashfs (`.sqsh`), checked file by file and
smoke-tested, recorded in the report next to the registry digest under the same SHA tag.

Like `enroot import`: the layers of `docker save` applied in order with whiteouts (builder/release/sqsh_rootfs.py),
dev/* left out, enroot's /etc/{environment,rc,rc.local,fstab} written from the image config, then Debian's
`mksquashfs` with enroot's ENROOT_SQUASH_OPTIONS default and the fast LZO variant (`-comp lzo -Xalgorithm
lzo1x_1 -noD` unless BUILDER_SQUASH_OPTIONS, read into Settings, says otherwise). Unlike enroot, owners and
modes are kept (no -all-root, no fixperms). Reproducible: every file keeps the modification time its layer
recorded (a timestamp .pyc is valid only beside its source's: with one time for all, `-all-time`, every such
.pyc of the image is stale, and each process recompiles what it imports, in memory, from a read-only image);
the files the export writes and the filesystem's own time are SOURCE_DATE_EPOCH; mksquashfs sorts its input;
xattrs only when the image has them. The .sqsh is read back with `unsquashfs` (into RAM when it has room) and
must equal the tree computed from the layers in memory (modes, owners, contents, times); then the provenance
gate runs on the unpacked tree in a network-none container.
Nothing is left behind on failure: the .sqsh is renamed into place only once both checks passed. It is kept by
its sha256 (`sha256-<hex>.sqsh` and its `.sha256`) and named by a pointer under the SHA tag, per platform
(`<repository path, / as +>+<SHA tag>.<os>-<arch>.sqsh`, or --out), flipped in one rename (sqsh_layout.py).
An image ID exported before with the same options is a cache hit: the earlier .sqsh, its sha256 checked
again in full, is reused (copied when --out's directory differs); `<cache>/sqsh/exports/` indexes them.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import files as fs
from builder.core import log
from builder.core.constants import SOURCE_DATE_EPOCH
from builder.core.errors import BadInput, InfraError, NotAccepted
from builder.core.imageref import ImageRef
from builder.core.options import Settings, check_squash_options
from builder.core.records import Report, SqshExport
from builder.engine import client as engine
from builder.engine import normalize
from builder.pins.model import Pins
from builder.release import publish, sqsh_layout
from builder.release import sqsh_rootfs as layers
from builder.release import sqsh_trees as kept
from builder.release.sqsh_rootfs import Entry
from builder.report import document as report_mod

Smoke = Callable[[Pins, Path], dict[str, Any]]  # a gate on the unpacked tree: {status, reason, ...}

ENROOT_FILES = ("etc/environment", "etc/fstab", "etc/rc", "etc/rc.local")
RC_LOCAL = ("# This file is sourced by /etc/rc when the container starts.\n"
            "# It can be used to manipulate the entrypoint or the command of the container.\n")
SHOW = 10  # differences listed in an error
MTIMES = "layers"  # SqshExport.mtimes: each file keeps its layer's time
RAM = Path("/dev/shm")  # the read-back unpacks under RAM_DIR when this has room (RAM_ROOM x the .sqsh)
RAM_DIR = RAM / "rl-image-builder"  # the tool's own folder: its sweep touches nothing else in /dev/shm
RAM_ROOM = 4


def tools() -> dict[str, str]:
    """mksquashfs / unsquashfs paths, else InfraError (installed by `builder setup`)."""
    found = {name: shutil.which(name) for name in ("mksquashfs", "unsquashfs")}
    missing = [name for name, path in found.items() if not path]
    if missing:
        raise InfraError(f"{', '.join(missing)}: missing; run `builder setup` (apt-get install squashfs-tools)")
    return {name: str(path) for name, path in found.items()}


def _run(argv: list[str], what: str) -> str:
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise InfraError(f"{what}: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout


def _quote(word: str) -> str:
    """bash's ${word@Q}, which enroot uses to write /etc/rc."""
    return "'" + word.replace("'", "'\\''") + "'"


def enroot_files(config: dict[str, Any]) -> dict[str, bytes]:
    """What `enroot import` writes into the rootfs from the image config (docker::configure)."""
    cfg = config.get("config") or {}
    env = "".join(f"{item}\n" for item in cfg.get("Env") or [])
    fstab = "".join(f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n"
                    for v in sorted(cfg.get("Volumes") or {}))
    labels = "".join(f"# {k} {v}\n" for k, v in (cfg.get("Labels") or {}).items())
    entry, cmd = list(cfg.get("Entrypoint") or []), list(cfg.get("Cmd") or [])
    if not entry and not cmd:
        cmd = ["/bin/sh"]
    workdir = cfg.get("WorkingDir") or "/"
    ep = " ".join(_quote(w) for w in entry)
    rc = (labels + ("\n" if labels else "")
          + f'mkdir -p "{workdir}" 2> /dev/null\ncd "{workdir}" && unset OLDPWD || exit 1\n\n'
          + "if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\n"
          + f'if [ $# -gt 0 ]; then\n    exec {ep} "$@"\nelse\n'
          + f"    exec {ep} {' '.join(_quote(w) for w in cmd)}\nfi\n")
    return {"etc/environment": env.encode(), "etc/fstab": fstab.encode(), "etc/rc": rc.encode(),
            "etc/rc.local": RC_LOCAL.encode()}


def write_enroot_files(rootfs: Path, files: dict[str, bytes], workdir: str) -> dict[str, Entry]:
    """Write them (root:root 0644, as enroot's shell does; missing directories 0755) and return the
    entries of what was written or created."""
    out = {}
    for rel in [workdir.strip("/")] + [name.rpartition("/")[0] for name in files]:
        parts = [p for p in rel.split("/") if p]
        for i in range(len(parts)):
            sub = "/".join(parts[:i + 1])
            path = layers._inside(rootfs, sub)
            if not path.is_dir():
                layers._remove(path)
                path.mkdir(mode=0o755)
                path.chmod(0o755)
                out[sub] = Entry(kind="d", mode=0o755, uid=0, gid=0, mtime=SOURCE_DATE_EPOCH)
    for rel, data in files.items():
        path = layers._inside(rootfs, rel)
        layers._remove(path)
        path.write_bytes(data)
        path.chmod(0o644)
        os.chown(path, 0, 0)
        out[rel] = Entry(kind="f", mode=0o644, uid=0, gid=0, sha256=hashlib.sha256(data).hexdigest(),
                         mtime=SOURCE_DATE_EPOCH)
    return out


def mksquashfs(rootfs: Path, out: Path, squash_options: str, xattrs: bool) -> list[str]:
    argv = [tools()["mksquashfs"], str(rootfs), str(out), "-noappend", "-no-progress", "-quiet",
            "-mkfs-time", str(SOURCE_DATE_EPOCH),
            "-xattrs" if xattrs else "-no-xattrs", *shlex.split(squash_options)]
    _run(argv, "mksquashfs")
    return argv


def readback_dir(work: Path, sqsh: Path) -> Path:
    """Where the read-back unpacks: a private directory in RAM (/dev/shm) when it has RAM_ROOM times the .sqsh
    free (unpacking 1 GB to disk took twice as long), else in the work directory."""
    try:
        room = shutil.disk_usage(RAM).free >= RAM_ROOM * sqsh.stat().st_size
    except OSError:
        room = False
    if room:
        fs.sweep_parts(RAM_DIR)  # what a killed export left there
        target = fs.part_dir(RAM_DIR, "sqsh-readback")
        target.rmdir()  # unsquashfs makes it
        return target
    return work / "readback"


def unsquash(sqsh: Path, dest: Path) -> None:
    """Unpack the .sqsh as root (owners, modes and xattrs as stored)."""
    _run([tools()["unsquashfs"], "-no-progress", "-quiet", "-d", str(dest), str(sqsh)], "unsquashfs")


def compare(expected: dict[str, Entry], got: dict[str, Entry]) -> list[str]:
    """Every difference as 'path: what', sorted by path."""
    diffs = []
    for path in sorted(set(expected) | set(got)):
        want, have = expected.get(path), got.get(path)
        if want is None:
            diffs.append(f"{path}: in the .sqsh, not in the image")
        elif have is None:
            diffs.append(f"{path}: in the image, missing from the .sqsh")
        elif want.kind != have.kind:
            diffs.append(f"{path}: kind {want.kind} in the image, {have.kind} in the .sqsh")
        elif want.kind == "l" and want.target != have.target:
            diffs.append(f"{path}: symlink to {want.target!r} in the image, {have.target!r} in the .sqsh")
        elif want.kind != "l" and want.mode != have.mode:
            diffs.append(f"{path}: mode {want.mode:04o} in the image, {have.mode:04o} in the .sqsh")
        elif (want.uid, want.gid) != (have.uid, have.gid):
            diffs.append(f"{path}: owner {want.uid}:{want.gid} in the image, {have.uid}:{have.gid} in the .sqsh")
        elif want.sha256 != have.sha256:
            diffs.append(f"{path}: sha256 {want.sha256[:12]} in the image, {have.sha256[:12]} in the .sqsh")
        elif want.xattrs != have.xattrs:
            diffs.append(f"{path}: xattrs differ")
        elif want.mtime != have.mtime:
            diffs.append(f"{path}: mtime {want.mtime} in the image, {have.mtime} in the .sqsh")
    return diffs


def check_equal(expected: dict[str, Entry], got: dict[str, Entry], where: str) -> None:
    diffs = compare(expected, got)
    if diffs:
        raise NotAccepted(f"{where}: {len(diffs)} differences from the image, first: " + "; ".join(diffs[:SHOW]))


def default_out(report: Report, report_path: Path) -> Path:
    """The pointer next to the report, enroot's naming with the platform: `<repository path with + for />+<SHA
    tag>.<os>-<arch>.sqsh` (a SHA tag may name a multi-arch index, so each platform's pointer says which it is)."""
    return sqsh_layout.pointer_path(report_path.parent, report.repository, report.name, report.tags[0],
                                    report.platform)


@dataclass
class Made:
    """A .sqsh written and checked: its tree (from the layers), how, and where it was unpacked."""

    expected: dict[str, Entry]
    argv: list[str]
    xattrs: bool
    times: dict[str, float]
    readback: Path | None           # the unpacked copy, when asked to keep it (keep_readback): the caller removes it
    reused: int = 0                 # layers whose tree came from an earlier export
    kept: Path | None = None        # the base tree to keep once the export passed (a part directory)


def make_sqsh(client: Any, image_id: str, out: Path, squash_options: str, work: Path, trees: Path | None = None,
              base: list[str] | None = None, stored: tuple[bytes, list[Path | None]] | None = None,
              keep_readback: bool = False) -> Made:
    """Write the .sqsh of an image (by ID) to out and check it equals the layers' tree. The unpacked copy
    (work/readback, or in RAM) is removed, unless `keep_readback` (for the smoke): then `Made.readback` names it
    and the caller removes it. Raises NotAccepted listing the first differences.
    `trees`: where base trees are kept (builder/release/sqsh_trees.py); the tree of the first layers, when kept,
    is reused, and that of `base` (the diff IDs of the base image) is kept once the export passed.
    `stored`: the image's config and layer blobs in the build's store (normalize.stored_image); with a kept tree,
    only the layers above it are read from there, and the engine is not asked for the image at all."""
    times: dict[str, float] = {}
    stored_diff_ids = json.loads(stored[0]).get("rootfs", {}).get("diff_ids", []) if stored else []
    reuse = kept.find(trees, stored_diff_ids) if trees and stored else None
    if stored and reuse and all(blob is not None for blob in stored[1][reuse.count:]):
        with _timed(times, "layers from the blob store"):  # only those above the kept tree
            saved = layers.from_blobs(stored[0], stored[1], reuse.count, image_id, work / "image.tar")
    else:
        with _timed(times, "docker save"):
            saved = layers.save(client, image_id, work / "image.tar")
        reuse = kept.find(trees, list(saved.config["rootfs"]["diff_ids"])) if trees else None
    diff_ids = list(saved.config["rootfs"]["diff_ids"])
    start = reuse.count if reuse else 0
    base = base or []
    keep_at = len(base) if trees and start < len(base) and diff_ids[:len(base)] == base else 0
    at_base: dict[str, dict[str, Entry]] = {}
    snap: list[Path] = []
    with _timed(times, "tree from the layers"):
        expected = layers.expected_tree(saved, start, reuse.entries if reuse else None,
                                        lambda i, tree: at_base.update(tree=dict(tree)) if i == keep_at - 1 else None)
    rootfs = work / "rootfs"
    readback: Path | None = None

    def take(index: int, xattrs: bool) -> None:
        if index == keep_at - 1 and trees:
            snap.append(kept.snapshot(trees, rootfs, diff_ids[:keep_at], at_base["tree"], xattrs))

    try:
        with _timed(times, "apply layers"):
            try:
                if reuse:
                    kept.link_copy(reuse.rootfs, rootfs)
                else:
                    rootfs.mkdir(mode=0o755)
                xattrs = layers.apply_layers(saved, rootfs, start, bool(reuse and reuse.xattrs), take,
                                             start if reuse else keep_at or None)
            except layers.SharedInode as why:  # the kept tree's inodes must not change: build this one cold
                log.info(f"sqsh: {why}; applying every layer")
                _drop(snap, rootfs)
                rootfs.mkdir(mode=0o755)
                if reuse and stored:  # the layers below the kept tree are placeholders there
                    saved = layers.save(client, image_id, work / "image.tar")
                start, xattrs = 0, layers.apply_layers(saved, rootfs)
            (work / "image.tar").unlink()
            workdir = (saved.config.get("config") or {}).get("WorkingDir") or "/"
            expected.update(write_enroot_files(rootfs, enroot_files(saved.config), workdir))
            layers.set_times(rootfs, expected, SOURCE_DATE_EPOCH)
        with _timed(times, "mksquashfs"):
            argv = mksquashfs(rootfs, out, squash_options, xattrs)
            shutil.rmtree(rootfs)
        with _timed(times, "read back and compare"):
            readback = readback_dir(work, out)
            unsquash(out, readback)
            check_equal(expected, layers.tree_of(readback), str(out))
        if not keep_readback:
            shutil.rmtree(readback)
            readback = None
    except BaseException:
        _drop(snap, None)
        if readback is not None:
            shutil.rmtree(readback, ignore_errors=True)
        raise
    if start:
        log.info(f"sqsh: the tree of the first {start} of {len(diff_ids)} layers was kept from an earlier export")
    return Made(expected=expected, argv=argv, xattrs=xattrs, times=times, readback=readback,
                reused=start, kept=snap[0] if snap else None)


def _drop(snap: list[Path], rootfs: Path | None) -> None:
    for part in snap:
        shutil.rmtree(part, ignore_errors=True)
    snap.clear()
    if rootfs is not None:
        shutil.rmtree(rootfs, ignore_errors=True)


def export(report: Report, report_path: Path, pins: Pins | None, settings: Settings, out: Path | None = None,
           client: Any = None, squash_options: str | None = None, smoke: Smoke | None = None) -> SqshExport:
    """Write the .sqsh of an ACCEPTED report's image, check it, smoke it, record it in the report.
    `pins`: what `trust.check` re-read and checked against the report. `smoke`: the gate on the unpacked tree
    (builder/runners/sqsh_smoke.py, passed in by the use case); None: not smoked (--no-smoke)."""
    if report.verdict != "ACCEPTED":
        raise NotAccepted(f"{report_path}: verdict is {report.verdict}; only an ACCEPTED image is exported")
    publish.check_accepted(report, str(report_path))  # and the gates must support the verdict
    squash_options = settings.squash_options if squash_options is None else check_squash_options(
        squash_options, "--squash-options")
    out = (Path(out) if out else default_out(report, report_path)).absolute()
    if out.suffix != ".sqsh" or not out.parent.is_dir():
        raise BadInput(f"--out {out}: expected a file name ending in .sqsh in an existing directory")
    if os.geteuid() != 0:
        raise InfraError("export-sqsh: must run as root (owners and modes of the image are kept)")
    version = _run([tools()["mksquashfs"], "-version"], "mksquashfs -version").splitlines()[0]
    hit = cached_export(settings, report, out, squash_options, version, smoke is not None)
    if hit is not None:
        report = report.model_copy(update={"sqsh": hit})
        report_mod.write(report, report_path.parent)
        follows(settings, report, out, hit.sha256)
        log.info(f".sqsh {out} sha256:{hit.sha256}: already exported ({hit.seconds['cache hit']} s)")
        return hit
    client = client or engine.connect(settings)  # `builder export-sqsh` itself: its one connect, after the refusals

    def smoked(made: Made) -> dict[str, Any]:
        assert smoke is not None
        if pins is None:
            raise NotAccepted(f"{report_path}: no pins checked against the report for the smoke")
        assert made.readback is not None  # _write keeps the unpacked copy for a check
        with _timed(made.times, "smoke: provenance gate"):
            result = smoke(pins, made.readback)
        if result["status"] != "pass":
            raise NotAccepted(f"{out}: provenance gate on the .sqsh contents: {result['status']}: {result['reason']}")
        return result

    with log.step("sqsh: base layers"):  # the engine's one use in a warm export (its layers come from the store)
        base = base_layers(client, report.base_image)
    made, digest, result = _write(client, report.image_id, out, squash_options, settings, base,
                                  smoked if smoke is not None else None, by_digest=True)
    result = result or {"status": "not_run", "reason": "not asked (--no-smoke)"}
    record = _record(made, sqsh_layout.blob_path(out.parent, digest), digest, squash_options, version,
                     report.image_id, tag=report.tags[0],
                     registry_digest=report.publish.digest if report.publish else "not published", smoke=result,
                     seconds=made.times).model_copy(update={"pointer": str(out)})
    report = report.model_copy(update={"sqsh": record})
    report_mod.write(report, report_path.parent)
    remember(settings, record, smoke is not None)
    follows(settings, report, out, digest)
    log.info(f".sqsh {out} -> {Path(record.path).name} ({record.size / 1e6:.1f} MB, {squash_options}); "
             f"registry {record.registry_digest}; tag {record.tag}")
    return record


def follows(settings: Settings, report: Report, pointer: Path, sha256: str) -> None:
    """A published report's pointer follows its registry digest (sqsh_layout.py): recorded for gc and the next
    publish of its SHA tag."""
    if report.publish is not None:
        sqsh_layout.remember(settings, sqsh_layout.Pointer(
            pointer=str(pointer), repository=report.repository, tag=report.tags[0], platform=report.platform,
            digest=report.publish.digest, sha256=sha256))


def _write(client: Any, image_id: str, out: Path, squash_options: str, settings: Settings, base: list[str] | None,
           check: Callable[[Made], dict[str, Any]] | None = None, by_digest: bool = False,
           ) -> tuple[Made, str, dict[str, Any]]:
    """make_sqsh into a part file beside `out`, `check(made)` (the smoke) before it is renamed into place, then its
    `.sha256` beside it (`by_digest`: kept by its sha256 with `out` a pointer onto it). The base tree is kept once
    the file-by-file check passed, before the smoke: a failed smoke
    (or an engine down for it) says nothing against the tree, and the rerun starts from it. Nothing else is left
    behind on failure.
    Returns (made, sha256, what check returned)."""
    fs.sweep_parts(out.parent)  # what a killed run left
    fs.sweep_parts(settings.cache("sqsh"))
    trees = settings.cache("sqsh", "trees")
    fs.sweep_parts(trees)
    with first_on_base(trees, base):
        return _write_unlocked(client, image_id, out, squash_options, settings, base, check, trees, by_digest)


@contextmanager
def first_on_base(trees: Path, base: list[str] | None) -> Iterator[None]:
    """Exports on a base whose tree is not kept yet run one at a time: the first applies every layer and keeps the
    base's tree, those that waited find it and apply only their own layers (a nightly fleet's variants share one
    base and start together). Once the tree is kept, exports run side by side."""
    if not base or kept.find(trees, base) is not None:
        yield
        return
    trees.mkdir(parents=True, exist_ok=True)
    with fs.locked(trees / f".{kept.key(base)}.lock"):
        if kept.find(trees, base) is None:  # still none: this export makes it while the others wait
            yield
            return
    log.info("sqsh: the base's tree was kept by an export that ran meanwhile")
    yield


def _write_unlocked(client: Any, image_id: str, out: Path, squash_options: str, settings: Settings,
                    base: list[str] | None, check: Callable[[Made], dict[str, Any]] | None,
                    trees: Path, by_digest: bool) -> tuple[Made, str, dict[str, Any]]:
    work = fs.part_dir(settings.cache("sqsh"), "sqsh")
    partial = fs.part_path(out)
    made: Made | None = None
    try:
        made = make_sqsh(client, image_id, partial, squash_options, work, trees, base,
                         normalize.stored_image(settings, image_id), keep_readback=check is not None)
        if made.kept:
            kept.keep(trees, made.kept)
        checked = check(made) if check else {}
        digest = fs.sha256_file(partial)
        if by_digest:  # kept by its sha256, then the pointer flips onto it
            sqsh_layout.point(out, sqsh_layout.keep(partial, digest)[0])
            return made, digest, checked
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        if made and made.readback:
            shutil.rmtree(made.readback, ignore_errors=True)
        if made and made.kept:
            shutil.rmtree(made.kept, ignore_errors=True)
    fs.write_atomic(out.with_name(out.name + ".sha256"), f"{digest}  {out.name}\n")
    return made, digest, checked


def _record(made: Made, out: Path, digest: str, squash_options: str, version: str, image_id: str, tag: str,
            registry_digest: str, smoke: dict[str, Any], seconds: dict[str, float]) -> SqshExport:
    """The record of a .sqsh that `_write` placed at `out`."""
    expected = made.expected
    return SqshExport(
        path=str(out), sha256=digest, size=out.stat().st_size, compression=squash_options, mksquashfs=version,
        mksquashfs_args=made.argv[3:], mtimes=MTIMES, image_id=image_id, tag=tag, registry_digest=registry_digest,
        entries=len(expected), files=sum(e.kind == "f" for e in expected.values()), xattrs=made.xattrs,
        enroot_files={k: v.sha256 for k, v in expected.items() if k in ENROOT_FILES}, equivalence="pass",
        smoke=smoke, seconds=seconds, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def base_layers(client: Any, base_image: str) -> list[str]:
    """The diff IDs of the report's base image when the engine has it (its tree is kept for the next export)."""
    try:
        ref = ImageRef(base_image, need_digest=True)
    except ValueError:  # a report from before base_image was recorded says "unknown"
        return []
    attrs = engine.inspect_image(client, ref) or {}
    return list((attrs.get("RootFS") or {}).get("Layers") or [])


def _cache_entry(settings: Settings, image_id: str, squash_options: str, version: str, smoke: bool) -> Path:
    key = hashlib.sha256(f"{image_id}\n{squash_options}\n{version}\n{smoke}\n{MTIMES}".encode()).hexdigest()[:24]
    return settings.cache("sqsh", "exports") / f"{key}.json"


def remember(settings: Settings, record: SqshExport, smoke: bool) -> None:
    """Index an export by image ID, squash options, mksquashfs version and whether it was smoked."""
    entry = _cache_entry(settings, record.image_id, record.compression, record.mksquashfs, smoke)
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")  # another export may write the same entry
    tmp.write_text(record.model_dump_json(indent=2) + "\n")
    tmp.replace(entry)


def cached_export(settings: Settings, report: Report, out: Path, squash_options: str, version: str,
                  smoke: bool) -> SqshExport | None:
    """The record of an earlier export of the same image ID with the same options, when its .sqsh is
    still there with the sha256 it was recorded with (read in full); kept by digest beside `out` (copied when it
    lies elsewhere) and `out` a pointer onto it."""
    start = time.monotonic()
    entry = _cache_entry(settings, report.image_id, squash_options, version, smoke)
    if not report.image_id.startswith("sha256:") or not entry.exists():
        return None
    record = SqshExport.model_validate_json(entry.read_text())
    made = Path(record.path)
    if not made.is_file() or made.stat().st_size != record.size or fs.sha256_file(made) != record.sha256:
        return None
    blob = sqsh_layout.blob_path(out.parent, record.sha256)
    if made.resolve() != blob.resolve():
        partial = fs.part_path(blob)
        try:
            shutil.copyfile(made, partial)
            if fs.sha256_file(partial) != record.sha256:
                return None
            sqsh_layout.keep(partial, record.sha256)
        finally:
            partial.unlink(missing_ok=True)
    sqsh_layout.point(out, blob)
    return record.model_copy(update={
        "path": str(blob), "pointer": str(out), "tag": report.tags[0],
        "registry_digest": report.publish.digest if report.publish else "not published",
        "seconds": {"cache hit": round(time.monotonic() - start, 2)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


@contextmanager
def _timed(times: dict[str, float], name: str) -> Iterator[None]:
    start = time.monotonic()
    with log.step(f"sqsh: {name}"):
        yield
    times[name] = round(time.monotonic() - start, 2)


def export_candidate(image_id: str, out: Path, settings: Settings, client: Any,
                     base_image: str | None = None) -> SqshExport:
    """A candidate's .sqsh before acceptance (the cluster gates accept it), checked file by file against
    its layers, no smoke (the gates that follow run on it). The same image ID exported to the same file
    before with the same options, with its `.json` record beside it, is reused when size and modification
    time still match; the node-side sha256 check catches any later change. `base_image` (the pins' base by
    digest): its layers' tree is kept, and an earlier export's kept tree is reused (builder/release/sqsh_trees.py)."""
    if os.geteuid() != 0:
        raise InfraError("export-sqsh: must run as root (owners and modes of the image are kept)")
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with fs.locked(out.with_name(f".{out.name}.lock")):  # concurrent runs of one image export it once
        return _export_candidate(image_id, out, settings, client, base_image)


def _export_candidate(image_id: str, out: Path, settings: Settings, client: Any, base_image: str | None,
                      ) -> SqshExport:
    record_path = out.with_name(out.name + ".json")
    squash_options = settings.squash_options
    version = _run([tools()["mksquashfs"], "-version"], "mksquashfs -version").splitlines()[0]
    if out.is_file() and record_path.is_file():
        record = SqshExport.model_validate_json(record_path.read_text())
        stat = out.stat()
        if (record.image_id, record.compression, record.mksquashfs, record.size, record.seconds.get("mtime"),
                record.mtimes) == (image_id, squash_options, version, stat.st_size, stat.st_mtime, MTIMES):
            log.info(f".sqsh {out}: exported before (sha256:{record.sha256[:16]}...)")
            return record
    made, digest, _ = _write(client, image_id, out, squash_options, settings,
                             base_layers(client, base_image) if base_image else None)
    record = _record(made, out, digest, squash_options, version, image_id, tag="candidate",
                     registry_digest="not published", smoke={"status": "not_run", "reason": "the cluster gates run on it"},
                     seconds={**made.times, "reused layers": made.reused, "mtime": out.stat().st_mtime})
    fs.write_atomic(record_path, record.model_dump_json(indent=2) + "\n")
    log.info(f".sqsh {out} sha256:{digest} ({record.size / 1e6:.1f} MB) exported for the cluster gates")
    return record
