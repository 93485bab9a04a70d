"""Set-up installs what is missing in one apt-get round (engine, registry, host tools, debootstrap, pigz), no Docker."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from builder.core.options import Settings
from builder.engine import infra


def test_one_apt_round_installs_every_missing_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rounds: list[tuple[str, ...]] = []
    monkeypatch.setattr("builder.engine.infra.shutil.which", lambda name: "/usr/bin/apt-get" if name == "apt-get"
                        else None)
    monkeypatch.setattr(infra, "registry_answers", lambda timeout=2.0: False)
    monkeypatch.setattr(infra, "REGISTRY_BIN", str(tmp_path / "none"))
    monkeypatch.setattr(infra, "_engine_answers", lambda settings: False)
    monkeypatch.setattr("builder.engine.infra.os.geteuid", lambda: 0)
    monkeypatch.setattr("builder.core.commands.apt_install", lambda logfile, *names: rounds.append(names))
    for name in ("ensure_engine", "ensure_registry", "ensure_tools"):
        monkeypatch.setattr(infra, name, lambda settings: {})
    infra.ensure_all(replace(Settings.from_env(), cache_root=tmp_path))
    assert rounds == [("docker.io", "docker-registry", "squashfs-tools", "debootstrap", "pigz")]


def test_an_answering_engine_needs_no_engine_package() -> None:
    assert "docker.io" not in infra.missing_packages(engine_answers=True)
