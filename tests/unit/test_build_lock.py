"""A no-cache build runs alone on its engine (builder/image/build.py): other builds of runs sharing the cache wait
for it, and it waits for them; normal builds of different runs run side by side, of one run one after another."""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builder.core.options import Settings
from builder.image import build


def _timeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: bool, second: bool,
              keys: tuple[str, str] = ("k1", "k2")) -> list[str]:
    events: list[str] = []
    started = threading.Event()

    def fake(rendered: Any, settings: Settings, nocache: bool, echo: bool, client: Any = None) -> Any:
        events.append(f"start {rendered.tag}")
        started.set()
        time.sleep(0.4)
        events.append(f"end {rendered.tag}")
        return rendered

    monkeypatch.setattr(build, "_build_keyed", fake)
    settings = dataclasses.replace(Settings.from_env({}), cache_root=tmp_path / "cache")
    a, b = (SimpleNamespace(tag=tag, cache_key=key) for tag, key in zip("ab", keys))
    one = threading.Thread(target=build.build, args=(a, settings, first))
    one.start()
    assert started.wait(5)
    build.build(b, settings, second)  # type: ignore[arg-type]
    one.join()
    return events


def test_a_nocache_build_waits_for_a_running_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _timeline(tmp_path, monkeypatch, False, True) == ["start a", "end a", "start b", "end b"]


def test_a_build_waits_for_a_running_nocache_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _timeline(tmp_path, monkeypatch, True, False) == ["start a", "end a", "start b", "end b"]


def test_builds_with_the_cache_run_side_by_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _timeline(tmp_path, monkeypatch, False, False)
    assert events[:2] == ["start a", "start b"] and sorted(events[2:]) == ["end a", "end b"]  # b began while a ran


def test_builds_of_one_run_wait_for_each_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    events = _timeline(tmp_path, monkeypatch, False, False, keys=("k1", "k1"))
    assert events == ["start a", "end a", "start b", "end b"]
    assert "docker build b: waiting for another build of this run" in capsys.readouterr().err
