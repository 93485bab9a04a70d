"""The nightly's own steps (the use case is `builder.pipeline.nightly_runs.nightly`): follow the PR heads, find the
last ACCEPTED run of the same pins name (history in the cache), list the commits since, and move
`nightly` + `nightly-YYYYMMDD` to the published digest, pruning old ones."""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import log
from builder.core.constants import COMPONENTS
from builder.core.errors import BadInput, PublishError
from builder.core.imageref import Repository
from builder.core.options import Settings
from builder.core.records import Report
from builder.engine.registry import Registry, get_json
from builder.nightly.history import History
from builder.pins import model as pins_model
from builder.pins.model import Pins
from builder.release import journal, promote
from builder.report import document as report_mod
from builder.sources import mirror

NIGHTLY = "nightly"
DATED = re.compile(r"^nightly-(\d{8})$")


def follow_prs(pins: Pins, settings: Settings) -> tuple[Pins, list[dict[str, Any]]]:
    """Move each component's commit to its PR's current head: rewrite the pins file in place (only the
    commit values change) and return the moved pins with what moved (ahead/behind of the new head
    against the old pin)."""
    pins_path = pins.path
    text = pins_path.read_text()
    moved = []
    for name in COMPONENTS:
        pin = pins.components[name]
        pr_ref = f"refs/pull/{pin.pr}/head"
        repo, found = mirror.sync(settings, pins.component_url(name), {pr_ref: f"refs/remotes/origin/pr/{pin.pr}"})
        head = found.get(pr_ref)
        if head is None:
            raise BadInput(f"{pins_path}: components.{name}.pr: {pr_ref} not found at {pin.url}")
        if str(head) == pin.commit:
            continue
        ahead, behind = repo.ahead_behind(head, pin.commit)
        if text.count(pin.commit) != 1:
            raise BadInput(f"{pins_path}: components.{name}.commit: expected {pin.commit} once in the file")
        text = text.replace(pin.commit, str(head))
        moved.append({"component": name, "pr": pin.pr, "old": pin.commit, "new": str(head),
                      "ahead": ahead, "behind": behind})
        log.info(f"{name}: PR #{pin.pr} {pin.commit[:12]} -> {str(head)[:12]} (+{ahead} / -{behind})")
    if not moved:
        return pins, moved
    fd, tmp = tempfile.mkstemp(dir=pins_path.parent, prefix=f".{pins_path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, pins_path)
    return pins_model.load(pins_path), moved  # the file now holds the moved commits (and their sha256)


def commit_log(report: Report, previous: Report | None, settings: Settings,
               limit: int = 50) -> dict[str, list[dict[str, str]]]:
    """Commits in each moved component since the previous run's pin (from the mirrors)."""
    import pygit2  # lazy: pygit2 loads libgit2, only for the commit walk

    out: dict[str, list[dict[str, str]]] = {}
    for name, comp in report.sources.components.items():
        old = previous.sources.components.get(name) if previous else None
        if old is None or old.commit == comp.commit:
            continue
        repo = mirror.open_mirror(settings, comp.url)
        walker = repo.walk(comp.commit, pygit2.enums.SortMode.TOPOLOGICAL)
        try:
            walker.hide(old.commit)
        except (KeyError, ValueError):
            pass
        out[name] = [{"sha": str(c.id), "subject": c.message.splitlines()[0] if c.message else ""}
                     for _, c in zip(range(limit), walker)]
    return out


def nightly_tags(today: str | None = None) -> list[str]:
    """`nightly` and `nightly-<today>` (UTC), in the order they move."""
    return [NIGHTLY, f"nightly-{today or time.strftime('%Y%m%d', time.gmtime())}"]


def move_tags(repository: Repository, digest: str, retention: int, settings: Settings,
              today: str | None = None) -> dict[str, Any]:
    """Point `nightly` and `nightly-<today>` at digest (same manifest bytes; publish moved them already, after the
    release's own tags, builder/release/publish.py), then prune dated tags beyond `retention`.  A registry that
    cannot delete a tag alone loses the old manifest instead, but only when
    no tag that stays (nightly, a kept nightly-*, a human tag) serves it."""
    host, name = repository.host, repository.path
    reg = Registry.from_settings(host, settings)
    got = reg.manifest(name, digest)
    if got["computed"] != digest:
        raise PublishError(f"{repository}@{digest}: registry serves {got['computed']}")
    tags = nightly_tags(today)
    with promote.repository_lock(repository, settings):
        promote.move_tags(reg, repository, bytes(got["content"]), str(got["media_type"]), tags)  # both or neither
        return {"digest": digest, "added": tags, "pruned": prune(reg, name, retention)}


def prune(reg: Registry, name: str, retention: int) -> list[str]:
    tags = (get_json(reg, f"/v2/{name}/tags/list", "application/json") or {}).get("tags") or []
    dated = sorted((t for t in tags if DATED.match(t)), reverse=True)
    drop = dated[retention:]
    if not drop:
        return []
    served = {t: reg.tag_digest(name, t) for t in tags}
    keep = {d for t, d in served.items() if t not in drop and not _sha_tag(t)}
    pruned = []
    for tag in drop:
        digest = served[tag]
        if reg._request("DELETE", f"/v2/{name}/manifests/{tag}").status_code == 202:
            pruned.append(tag)  # OCI 1.1 tag deletion
        elif digest and digest not in keep:
            _delete_with_referrers(reg, name, digest)
            if f"{reg.host}/{name}@{digest}" in reg.refused:  # said in one line by the registry client
                continue
            pruned.append(tag)
            log.info(f"pruned {reg.host}/{name}:{tag} ({digest}, with every tag and attestation on it)")
        else:
            log.info(f"kept {tag}: this registry cannot delete a tag alone and {digest} is still served by a kept tag")
    return pruned


def _sha_tag(tag: str) -> bool:
    return tag.startswith("vllm-") or tag.startswith("sha256-")


def _delete_with_referrers(reg: Registry, name: str, digest: str) -> None:
    journal.delete_with_referrers(reg, name, digest)


@dataclass(frozen=True)
class Previous:
    """The last ACCEPTED run of a pins name: its report, image manifest and published digest (all None if none)."""

    report: Report | None = None
    manifest: dict[str, Any] | None = None
    digest: str | None = None


def previous(history: History, name: str) -> Previous:
    run = history.last_accepted(name)
    if run is None:
        return Previous()
    report = report_mod.load(run.report_path)
    manifest_path = Path(run.report_path).parent / "image-manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    return Previous(report, manifest, run.digest)
