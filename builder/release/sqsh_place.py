"""`publish` of a cluster-accepted report (`--slurm`): the .sqsh the gates ran on goes beside the registry digest,
kept by its sha256 with a pointer per platform under the SHA tag's name (builder/release/sqsh_layout.py):
`<dir>/sha256-<hex>.sqsh` (+ `.sha256`) and `<dir>/<repository path with + for />+<SHA tag>.<os>-<arch>.sqsh`.

Before anything is promoted, the file is copied to a part file in the target directory and hashed; publish is
refused, with nothing published, when that copy's sha256 is not the one accepted (the runner's recorded sha256,
which the node also saw), or when the export record beside the accepted file (`<sqsh>.json`, written by
`sqsh.export_candidate`) names another sha256 or another image than the config of the staged registry digest.
The checked copy is then kept by digest (no pointer names it yet); once every tag moved and the receipt is written,
the pointer flips onto it in one rename and the report records it (`sqsh`). A refused or failed publish removes
the kept file again unless a pointer names it.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from builder.core import files as fs
from builder.core import log
from builder.core.errors import PublishError
from builder.core.imageref import Repository
from builder.core.options import Settings
from builder.core.records import PublishReceipt, Report, SlurmFacts, SqshExport
from builder.engine.registry import Registry
from builder.release import promote, publish, sqsh_layout
from builder.release.sqsh_layout import SqshMove


@dataclass
class Copy:
    """The accepted .sqsh copied (and checked) next to where it will be published, kept by digest, not yet named."""

    record: SqshExport
    blob: Path
    pointer: Path
    made: bool  # this publish put the kept file there (a refused publish removes it again)
    settings: Settings  # the cache where the pointer is recorded

    def discard(self) -> None:
        if self.made:
            sqsh_layout.drop_unnamed(self.blob)

    def journal(self) -> SqshMove:
        """The placement as the publish journal records it (the next command finishes it after a kill)."""
        return SqshMove(blob=str(self.blob), pointer=str(self.pointer), sha256=self.record.sha256, record=self.record)


def accepted(report: Report) -> dict[str, str] | None:
    """The .sqsh a Slurm acceptance ran on (path, recorded and node-side sha256), or None (Docker gates)."""
    facts = report.acceptance.where if report.acceptance else None
    if not isinstance(facts, SlurmFacts) or facts.sqsh is None:
        return None
    seen = {n.sqsh_sha256 for n in facts.nodes}
    return {"path": facts.sqsh.path, "sha256": facts.sqsh.sha256,
            "node": str(seen.pop()) if len(seen) == 1 else ",".join(sorted(str(s) for s in seen))}


def target(report: Report, directory: Path) -> Path:
    """The pointer under the SHA tag: `<repository path, / as +>+<SHA tag>.<os>-<arch>.sqsh`."""
    return sqsh_layout.pointer_path(directory, report.repository, report.name, report.tags[0], report.platform)


def prepare(report: Report, where: str, settings: Settings, directory: Path | None) -> Copy | None:
    """None for a report accepted by Docker gates. Otherwise the checked copy (PublishError when a sha256 or
    the image disagrees; nothing is promoted then). `directory`: default the one the gates read it from."""
    found = accepted(report)
    if found is None:
        return None
    publish.check_accepted(report, where)  # before a 1 GB copy
    sha = found["sha256"]
    src = Path(found["path"])
    if not sha or found["node"] != sha:
        raise PublishError(f"{where}: the .sqsh sha256 seen on the node ({found['node'][:16] or 'none'}) is not the "
                           f"recorded one ({sha[:16] or 'none'}); refusing")
    record = export_record(src, where)
    if record.sha256 != sha:
        raise PublishError(f"{where}: the export record {src}.json says sha256 {record.sha256[:16]}..., the gates "
                           f"accepted {sha[:16]}...; refusing")
    served, digest = registry_image(report, settings, where)
    if record.image_id != served:
        raise PublishError(f"{where}: the export record {src}.json is of image {record.image_id[:19]}, the registry "
                           f"digest serves {served[:19]}; refusing")
    directory = (directory or src.parent).absolute()
    if not directory.is_dir():
        raise PublishError(f"{where}: the .sqsh directory {directory} does not exist")
    dest = target(report, directory)
    fs.sweep_parts(directory)
    part = fs.part_path(sqsh_layout.blob_path(directory, sha))
    try:
        with log.step(f"copy the accepted .sqsh to {directory}"):
            shutil.copyfile(src, part)
            got = fs.sha256_file(part)
    except FileNotFoundError:
        part.unlink(missing_ok=True)
        raise PublishError(f"{where}: the accepted .sqsh {src} is gone; refusing") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    if got != sha:
        part.unlink(missing_ok=True)
        raise PublishError(f"{where}: the .sqsh being published ({src}) has sha256 {got[:16]}..., the gates accepted "
                           f"{sha[:16]}...; refusing")
    blob, made = sqsh_layout.keep(part, sha)
    record = record.model_copy(update={
        "path": str(blob), "pointer": str(dest), "tag": report.tags[0], "registry_digest": digest,
        "smoke": {"status": "not_run", "reason": "the cluster gates ran on this file"}})
    return Copy(record=record, blob=blob, pointer=dest, made=made, settings=settings)


def export_record(src: Path, where: str) -> SqshExport:
    path = src.with_name(src.name + ".json")
    try:
        return SqshExport.model_validate_json(path.read_text())
    except (OSError, ValueError):
        raise PublishError(f"{where}: no readable export record {path} beside the accepted .sqsh; refusing") from None


def registry_image(report: Report, settings: Settings, where: str) -> tuple[str, str]:
    """The image ID (config digest) the staged registry digest serves, and that digest."""
    staged = promote.accepted_ref(report, where)
    if staged is None:
        raise PublishError(f"{where}: accepted on the cluster without a staged registry digest; refusing")
    repo = Repository.of(staged)
    got = Registry.from_settings(repo.host, settings).manifest(repo.path, str(staged.digest))
    try:
        return str(json.loads(got["content"])["config"]["digest"]), str(staged.digest)
    except (ValueError, KeyError, TypeError):
        raise PublishError(f"{where}: {staged}: the registry serves no image manifest with a config") from None


def place(copy: Copy, report: Report, report_path: Path, receipt: PublishReceipt) -> SqshExport:
    """After the tags and the receipt: the pointer onto the kept file in one rename, the record in the report."""
    move = copy.journal()
    if not sqsh_layout.flip(move, report.repository, receipt.digest, report.platform, copy.settings,
                            check=False):
        raise PublishError(f"{report_path}: the kept .sqsh {copy.blob} is gone; the release stands without it")
    record = sqsh_layout.record_in_report(move, report_path)
    log.info(f".sqsh {copy.pointer} -> {copy.blob.name} beside {receipt.repository}@{receipt.digest}")
    return record

