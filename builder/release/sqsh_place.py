"""`publish` of a cluster-accepted report (`--slurm`): the .sqsh the gates ran on goes beside the registry digest,
under the same SHA tag name: `<dir>/<repository path with + for />+<SHA tag>.sqsh` and its `.sha256`.

Before anything is promoted, the file is copied to a part file in the target directory and hashed; publish is
refused, with nothing published, when that copy's sha256 is not the one accepted (the runner's recorded sha256,
which the node also saw), or when the export record beside the accepted file (`<sqsh>.json`, written by
`sqsh.export_candidate`) names another sha256 or another image than the config of the staged registry digest.
Once the registry digest is promoted, the copy is renamed into place and recorded in the report (`sqsh`).
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from builder.core import files as fs
from builder.core import log
from builder.core.errors import PublishError
from builder.core.imageref import ImageRef
from builder.core.options import Settings
from builder.core.records import PublishReceipt, Report, SqshExport
from builder.engine import staging
from builder.engine.registry import Registry, split_repository
from builder.release import journal, publish
from builder.release.journal import SqshMove
from builder.report import document as report_mod


@dataclass
class Copy:
    """The accepted .sqsh copied (and checked) next to where it will be published, not yet in place."""

    record: SqshExport
    part: Path
    dest: Path

    def discard(self) -> None:
        self.part.unlink(missing_ok=True)

    def journal(self) -> SqshMove:
        """The placement as the publish journal records it (the next command finishes it after a kill)."""
        return SqshMove(part=str(self.part), dest=str(self.dest), sha256=self.record.sha256)


def accepted(report: Report) -> dict[str, str] | None:
    """The .sqsh a Slurm acceptance ran on (path, recorded and node-side sha256), or None (Docker gates)."""
    facts = report.acceptance.container if report.acceptance else None
    if facts is None or facts.sqsh is None:
        return None
    seen = {n.sqsh_sha256 for n in facts.nodes}
    return {"path": facts.sqsh.path, "sha256": facts.sqsh.sha256,
            "node": str(seen.pop()) if len(seen) == 1 else ",".join(sorted(str(s) for s in seen))}


def target(report: Report, directory: Path) -> Path:
    """enroot's naming under the SHA tag: `<repository path, / as +>+<SHA tag>.sqsh`."""
    ref = ImageRef(report.repository)
    name = (ref.repository if ref.registry else "").replace("/", "+") or report.name
    return directory / f"{name}+{report.tags[0]}.sqsh"


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
    served = registry_image(report, settings, where)
    if record.image_id != served:
        raise PublishError(f"{where}: the export record {src}.json is of image {record.image_id[:19]}, the registry "
                           f"digest serves {served[:19]}; refusing")
    directory = (directory or src.parent).absolute()
    if not directory.is_dir():
        raise PublishError(f"{where}: the .sqsh directory {directory} does not exist")
    dest = target(report, directory)
    fs.sweep_parts(directory)
    part = fs.part_path(dest)
    try:
        with log.step(f"copy the accepted .sqsh to {dest.name}"):
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
    return Copy(record=record, part=part, dest=dest)


def export_record(src: Path, where: str) -> SqshExport:
    path = src.with_name(src.name + ".json")
    try:
        return SqshExport.model_validate_json(path.read_text())
    except (OSError, ValueError):
        raise PublishError(f"{where}: no readable export record {path} beside the accepted .sqsh; refusing") from None


def registry_image(report: Report, settings: Settings, where: str) -> str:
    """The image ID (config digest) the staged registry digest serves."""
    staged = staging.accepted_ref(report, where)
    if staged is None:
        raise PublishError(f"{where}: accepted on the cluster without a staged registry digest; refusing")
    host, name = split_repository(staged.name)
    got = Registry.from_settings(host, settings).manifest(name, str(staged.digest))
    try:
        return str(json.loads(got["content"])["config"]["digest"])
    except (ValueError, KeyError, TypeError):
        raise PublishError(f"{where}: {staged}: the registry serves no image manifest with a config") from None


def place(copy: Copy, report: Report, report_path: Path, receipt: PublishReceipt) -> SqshExport:
    """After the promotion: the copy into place, its `.sha256` beside it, the record in the report."""
    journal.install(copy.part, copy.dest, copy.record.sha256)
    record = copy.record.model_copy(update={
        "path": str(copy.dest), "tag": report.tags[0], "registry_digest": receipt.digest,
        "smoke": {"status": "not_run", "reason": "the cluster gates ran on this file"},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    report = report.model_copy(update={"sqsh": record})
    paths = report_mod.write(report, report_path.parent)
    if paths["json"].resolve() != report_path.resolve():
        fs.write_atomic(report_path, report.model_dump_json(indent=2) + "\n")
    log.info(f".sqsh {copy.dest} sha256:{record.sha256} beside {receipt.repository}@{receipt.digest}")
    return record
