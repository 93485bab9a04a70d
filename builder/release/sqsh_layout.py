"""Where a released `.sqsh` lies: kept by its own sha256, named per platform under the SHA tag by a pointer.

In one directory: `sha256-<hex>.sqsh` and `sha256-<hex>.sqsh.sha256` (the file's name is its sha256, so the two
never disagree; the `.sha256` is written first, the file renamed into place second), and per platform a pointer
`<repository path, / as +>+<SHA tag>.<os>-<arch>[-<variant>].sqsh`, a relative symlink to that file, replaced in one
rename (enroot and `sha256sum -c` read it as the file). The pointer follows that platform's image: a publish that
moves the SHA tag flips it to the new image's file, or removes it when the new image has none here. Each pointer
has a record in the cache (`<cache>/sqsh/pointers/`): the registry digest it follows; `builder gc` keeps every file
a pointer names and frees, after its age, the ones none names, in every directory a pointer was placed in
(`<cache>/sqsh/places/`).
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from pydantic import BaseModel

from builder.core import files as fs
from builder.core import log
from builder.core.imageref import ImageRef
from builder.core.options import Settings
from builder.core.records import SqshExport
from builder.report import document as report_mod

PREFIX = "sha256-"


class SqshMove(BaseModel):
    """A placement: the file kept by digest, the pointer to flip onto it, and the report's record of it."""
    blob: str
    pointer: str
    sha256: str
    record: SqshExport


class Pointer(BaseModel):
    """The cache's record of a pointer: which release tag and platform it names and the digest it follows."""
    pointer: str
    repository: str
    tag: str
    platform: str
    digest: str
    sha256: str


def blob_path(directory: Path, sha256: str) -> Path:
    return directory / f"{PREFIX}{sha256}.sqsh"


def sums_path(blob: Path) -> Path:
    return blob.with_name(blob.name + ".sha256")


def pointer_path(directory: Path, repository: str, fallback: str, sha_tag: str, platform: str) -> Path:
    """`<repository path, / as +>+<SHA tag>.<platform, / as ->.sqsh` (`fallback`: a repository with no registry)."""
    ref = ImageRef(repository)
    name = (ref.repository if ref.registry else "").replace("/", "+") or fallback
    return directory / f"{name}+{sha_tag}.{platform.replace('/', '-')}.sqsh"


def keep(part: Path, sha256: str) -> tuple[Path, bool]:
    """A checked part file kept by its sha256 beside it: its `.sha256` first, then the file; (the file, whether this
    call put it there: one already kept under that name stays when its bytes still hash to its name)."""
    blob = blob_path(part.parent, sha256)
    fs.write_atomic(sums_path(blob), f"{sha256}  {blob.name}\n")
    if blob.is_file() and blob.stat().st_size == part.stat().st_size and fs.sha256_file(blob) == sha256:
        part.unlink()
        return blob, False
    os.replace(part, blob)
    return blob, True


def point(pointer: Path, blob: Path) -> None:
    """The pointer onto `blob` (same directory) in one rename: readers see the old file or the new one."""
    tmp = fs.part_path(pointer)  # a killed writer's link is swept like any part file
    os.symlink(blob.name, tmp)
    os.replace(tmp, pointer)


def target(pointer: Path) -> Path | None:
    """The file a pointer names (None: not a pointer)."""
    return pointer.parent / os.readlink(pointer) if pointer.is_symlink() else None


def named(directory: Path) -> set[str]:
    """The file names the pointers in `directory` name."""
    return {os.readlink(p) for p in directory.glob("*.sqsh") if p.is_symlink()}


def drop_unnamed(blob: Path) -> None:
    """Remove a kept file (and its `.sha256`) that no pointer beside it names."""
    if blob.name not in named(blob.parent):
        blob.unlink(missing_ok=True)
        sums_path(blob).unlink(missing_ok=True)


def _record_path(settings: Settings, pointer: str) -> Path:
    return settings.cache("sqsh", "pointers") / f"{hashlib.sha256(pointer.encode()).hexdigest()[:24]}.json"


def records(settings: Settings) -> list[Pointer]:
    out = []
    for path in sorted(settings.cache("sqsh", "pointers").glob("*.json")):
        try:
            out.append(Pointer.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
    return out


def places(settings: Settings) -> dict[Path, Path]:
    """Every directory a pointer was placed in (for gc): {directory: its place file in the cache}."""
    out = {}
    for path in settings.cache("sqsh", "places").iterdir():
        if not path.name.startswith("."):
            out[Path(path.read_text().strip())] = path
    return out


def forget(settings: Settings, pointer: str) -> None:
    _record_path(settings, pointer).unlink(missing_ok=True)


def flip(move: SqshMove, repository: str, digest: str, platform: str, settings: Settings, check: bool) -> bool:
    """After the SHA tag serves `digest`: the pointer onto the kept file (`check`: hash it first, as after a kill),
    recorded in the cache; every other pointer of that tag and platform following another digest is removed.
    False (nothing flipped) when the kept file is gone or is not its sha256."""
    blob, pointer = Path(move.blob), Path(move.pointer)
    if not blob.is_file() or (check and fs.sha256_file(blob) != move.sha256):
        log.info(f".sqsh {blob}: gone or changed; {pointer.name} not moved")
        return False
    point(pointer, blob)
    remember(settings, Pointer(pointer=str(pointer), repository=repository, tag=move.record.tag, platform=platform,
                               digest=digest, sha256=move.sha256))
    return True


def remember(settings: Settings, found: Pointer) -> None:
    """Record a pointer that follows a published digest; then every other pointer of its tag and platform that
    follows another digest goes (`follow`)."""
    fs.write_atomic(_record_path(settings, found.pointer), found.model_dump_json(indent=1) + "\n")
    folder = str(Path(found.pointer).parent)
    fs.write_atomic(settings.cache("sqsh", "places") / f"{hashlib.sha256(folder.encode()).hexdigest()[:24]}",
                    folder + "\n")
    follow(settings, found.repository, found.tag, found.platform, found.digest)


def follow(settings: Settings, repository: str, tag: str, platform: str, digest: str) -> list[str]:
    """The SHA tag `tag` now serves `digest` for `platform`: a recorded pointer of it that follows another digest
    names another image's file, so it is removed (one unlink); returns the pointers removed."""
    gone = []
    for rec in records(settings):
        if (rec.repository, rec.tag, rec.platform) != (repository, tag, platform) or rec.digest == digest:
            continue
        path = Path(rec.pointer)
        if path.is_symlink() and os.readlink(path) == blob_path(path.parent, rec.sha256).name:
            path.unlink()
            gone.append(str(path))
            log.info(f".sqsh pointer {path} removed: {tag} ({platform}) now serves {digest[:19]}, which has no "
                     ".sqsh there")
        forget(settings, rec.pointer)
    return gone


def record_in_report(move: SqshMove, report_path: Path) -> SqshExport:
    """The placed .sqsh's record in the report (publish, or the journal's recovery after a kill)."""
    record = move.record.model_copy(update={"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    report = report_mod.load(report_path).model_copy(update={"sqsh": record})
    paths = report_mod.write(report, report_path.parent)
    if paths["json"].resolve() != report_path.resolve():
        fs.write_atomic(report_path, report.model_dump_json(indent=2) + "\n")
    return record
