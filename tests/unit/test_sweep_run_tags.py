"""Builds untag other runs' local names older than a day (builder/image/build.py sweep_run_tags, at most hourly), on a fake
engine: the integration test shares its engine with other workers' builds, whose sweeps may take a planted tag
first, so the exact list removed is checked here."""
from __future__ import annotations

import calendar
import dataclasses
import time
from typing import Any

from builder.core.options import Settings
from builder.image import build


class _Api:
    def __init__(self, tags: list[str]) -> None:
        self.tags = tags
        self.removed: list[tuple[str, bool]] = []

    def images(self, name: str) -> list[dict[str, Any]]:
        return [{"Id": f"sha256:{i:064x}", "RepoTags": [t], "Size": 1, "Created": i} for i, t in enumerate(self.tags)]

    def remove_image(self, tag: str, noprune: bool = False) -> None:
        self.removed.append((tag, noprune))


def test_only_other_runs_older_than_a_day_are_untagged_without_pruning() -> None:
    now = calendar.timegm(time.strptime("20261201120000", "%Y%m%d%H%M%S"))

    def stamp(seconds_ago: int) -> str:
        return time.strftime("%Y%m%d%H%M%S", time.gmtime(now - seconds_ago))

    old, fresh = f"{stamp(build.RUN_TAG_MAX_AGE_S + 60)}-0ld0ld00", f"{stamp(60)}-fre5h000"
    mine = f"{stamp(build.RUN_TAG_MAX_AGE_S + 3600)}-m1ne0000"  # this run's own tag, however old
    tags = [f"{build.LOCAL_REPOSITORY}/{run}:t" for run in (old, fresh, "by-hand", mine)]
    api = _Api(tags)
    settings = dataclasses.replace(Settings.from_env({}), run_id=mine)
    removed = build.sweep_run_tags(type("Client", (), {"api": api})(), settings, now=now)
    assert removed == [tags[0]] and api.removed == [(tags[0], True)]  # the old one; fresh, by hand and own stay


def test_builds_sweep_at_most_once_an_hour_per_cache_and_engine(tmp_path: Any) -> None:
    settings = dataclasses.replace(Settings.from_env({}), cache_root=tmp_path)
    other_engine = dataclasses.replace(settings, docker_host="unix:///tmp/other.sock")
    now = 2_000_000_000.0
    assert build.sweep_due(settings, now) and not build.sweep_due(settings, now + 60)
    assert build.sweep_due(other_engine, now + 60)  # each engine has its own
    assert not build.sweep_due(settings, now + build.SWEEP_EVERY_S - 1)
    assert build.sweep_due(settings, now + build.SWEEP_EVERY_S + 1)
    assert not build.sweep_due(settings, now + build.SWEEP_EVERY_S + 2)
