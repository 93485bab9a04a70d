"""`builder nightly PINS [--follow-prs] [--publish]`: rebuild and accept, compare with the last ACCEPTED
run of the same pins name (history in the cache), write nightly-diff.md / .json beside the report and,
when accepted and asked, move `nightly` + `nightly-YYYYMMDD` to the published digest and prune old ones.

Exit codes as `builder run`, plus 4: accepted, but a regression flag is up.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder.core import files as fs
from builder.core import log
from builder.core.constants import COMPONENTS, MANIFEST
from builder.core.errors import BadInput, PublishError
from builder.core.options import Settings
from builder.core.records import Report
from builder.engine import staging
from builder.engine.registry import Registry, get_json, split_repository
from builder.nightly import rundiff
from builder.nightly.history import History
from builder.report import document as report_mod
from builder.sources import mirror

REGRESSION_EXIT = 4
NIGHTLY = "nightly"
DATED = re.compile(r"^nightly-(\d{8})$")


def follow_prs(pins_path: Path, settings: Settings) -> list[dict[str, Any]]:
    """Move each component's commit to its PR's current head; rewrite the pins file in place (only the
    commit values change); return what moved with ahead/behind of the new head against the old pin."""
    from builder.pins import model as pins_mod

    pins = pins_mod.load(pins_path)
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
    if moved:
        fd, tmp = tempfile.mkstemp(dir=pins_path.parent, prefix=f".{pins_path.name}.")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, pins_path)
    return moved


def commit_log(report: Report, previous: Report | None, settings: Settings,
               limit: int = 50) -> dict[str, list[dict[str, str]]]:
    """Commits in each moved component since the previous run's pin (from the mirrors)."""
    import pygit2

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


def move_tags(repository: str, digest: str, retention: int, settings: Settings,
              today: str | None = None) -> dict[str, Any]:
    """Point `nightly` and `nightly-<today>` at digest (same manifest bytes), then prune dated tags beyond
    `retention`.  A registry that cannot delete a tag alone loses the old manifest instead, but only when
    no tag that stays (nightly, a kept nightly-*, a human tag) serves it."""
    host, name = split_repository(repository)
    reg = Registry.from_settings(host, settings)
    got = reg.manifest(name, digest)
    if got["computed"] != digest:
        raise PublishError(f"{repository}@{digest}: registry serves {got['computed']}")
    dated = f"nightly-{today or time.strftime('%Y%m%d', time.gmtime())}"
    config = json.loads(got["content"]).get("config", {}).get("digest", "")
    with staging.repository_lock(repository, settings):
        # through promote: both tags or neither (`nightly` written last, rolled back on a failure)
        staging.promote(f"{repository}@{digest}", config, repository, [NIGHTLY, dated], settings)
        return {"digest": digest, "added": [NIGHTLY, dated], "pruned": prune(reg, name, retention)}


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
            pruned.append(tag)
            log.info(f"pruned {reg.host}/{name}:{tag} ({digest}, with every tag and attestation on it)")
        else:
            log.info(f"kept {tag}: this registry cannot delete a tag alone and {digest} is still served by a kept tag")
    return pruned


def _sha_tag(tag: str) -> bool:
    return tag.startswith("vllm-") or tag.startswith("sha256-")


def _delete_with_referrers(reg: Registry, name: str, digest: str) -> None:
    from builder.release import referrers

    for desc in referrers.discover(reg, name, digest):
        reg.delete_manifest(name, desc["digest"])
    index = reg.tag_digest(name, referrers.fallback_tag(digest))
    if index:
        reg.delete_manifest(name, index)
    reg.delete_manifest(name, digest)


def _image_manifest(image_id: str, settings: Settings) -> dict[str, Any] | None:
    from builder.engine import client as engine

    data = engine.read_file(engine.connect(settings), image_id, MANIFEST)
    return json.loads(data) if data else None


def _previous(history: History, name: str) -> tuple[Report | None, dict[str, Any] | None, str | None]:
    run = history.last_accepted(name)
    if run is None:
        return None, None, None
    report = report_mod.load(run.report_path)
    manifest_path = Path(run.report_path).parent / "image-manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    return report, manifest, run.digest


def nightly(pins_path: Path, settings: Settings, follow_prs_: bool, publish: bool, out: Path | None,
            signing_key: Path | None, accept_and_report: Callable[[Path, Path | None], tuple[Report, Path]],
            history: History | None = None, today: str | None = None) -> int:
    """The whole nightly; returns the exit code (0, 1 or 4)."""
    from builder.pins import model as pins_mod
    from builder.release import publish as publish_mod

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    moved = []
    if follow_prs_:
        with log.step("follow PR heads"):
            moved = follow_prs(pins_path, settings)
        log.info(f"moved: {len(moved)} component(s)" if moved else "no PR head moved")
    pins = pins_mod.load(pins_path)
    history = history or History(settings.cache("history") / "runs.sqlite")
    previous, previous_manifest, previous_digest = _previous(history, pins.name)
    report, run_dir = accept_and_report(pins_path, out)
    manifest = _image_manifest(report.image_id, settings)
    fs.write_atomic(run_dir / "image-manifest.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    accepted = report.verdict == "ACCEPTED"
    digest, tags = None, None
    if accepted and publish:
        with log.step("publish"):
            receipt = publish_mod.publish(run_dir / "report.json", settings, signing_key=signing_key)
            digest = receipt.digest
            tags = move_tags(receipt.repository, digest, pins.nightly.retention, settings, today)
        report = report_mod.load(run_dir / "report.json")
    with log.step("compare with the last accepted run"):
        diff = rundiff.compare(report, manifest, digest, previous, previous_manifest, previous_digest,
                               pins.nightly.regression_threshold, commit_log(report, previous, settings))
        diff["moved"], diff["tags"] = moved, tags
        paths = rundiff.write(diff, run_dir)
    code = (REGRESSION_EXIT if diff["regression"]["flag"] else 0) if accepted else 1
    history.add(pins.name, started, report.verdict, report.image_id, digest,
                {n: c.commit for n, c in report.sources.components.items()}, run_dir / "report.json", code,
                diff["regression"]["flag"])
    log.info(f"nightly: {diff['summary']}")
    for reason in diff["regression"]["reasons"]:
        log.info(f"regression: {reason}")
    log.info(f"nightly diff: {paths['md']}")
    return code
