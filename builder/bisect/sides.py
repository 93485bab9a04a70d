"""GOOD and BAD: a pins file, a run's report.json, or a night of the history (by date or run id)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from builder.core import files as fs
from builder.core.errors import BadInput
from builder.engine import client as engine
from builder.image.render import cache_scope
from builder.nightly.history import History
from builder.pins import model as pins_model
from builder.pins.model import Pins
from builder.report import document


@dataclass(frozen=True)
class Side:
    label: str                  # what the user named: a path, or "night <id> (<date>)"
    pins: Pins
    commits: dict[str, str]
    image_id: str | None        # a report's image: GOOD's stored image when its commits no longer resolve
    published: str | None = None  # a report's published repository@digest: that image where the engine lost it


def load(spec: Path, which: str) -> Side:
    """A pins file (.yaml/.yml) or a report.json; BadInput (2) naming `which` when it is neither."""
    if not spec.is_file():
        raise BadInput(f"{which}: {spec} is not a file (expected a pins file or a run's report.json)")
    if spec.suffix == ".json":
        report = document.load(spec)
        pins = pins_model.load(Path(report.sources.pins_path))
        published = f"{report.publish.repository}@{report.publish.digest}" if report.publish else None
        return Side(str(spec), pins, {n: c.commit for n, c in report.sources.components.items()}, report.image_id,
                    published)
    pins = pins_model.load(spec)
    return Side(str(spec), pins, {n: c.commit for n, c in pins.components.items()}, None)


def night(history: History, name: str | None, night_spec: str, which: str) -> Path:
    """The report.json of a nightly run: `night_spec` a run id, or a date (YYYY-MM-DD: that day's latest night).
    Exit 2 naming the night when there is none or its report is gone. Runs by hand are no nights."""
    names = [name] if name else history.names()
    rows = [r for n in names for r in history.runs(n) if r.kind == "nightly"]
    if night_spec.isdigit():
        hits = [r for r in rows if r.id == int(night_spec)]
    else:
        hits = sorted((r for r in rows if r.started.startswith(night_spec)), key=lambda r: (r.started, r.id))
    if not hits:
        raise BadInput(f"{which}: no night {night_spec!r} in the history {history.path}")
    run = hits[-1]
    if not Path(run.report_path).is_file():
        raise BadInput(f"{which}: night {run.id} ({run.started}) of {run.pins_name}: its report {run.report_path}"
                       " is gone")
    return Path(run.report_path)


def stored_image(side: Side, client: engine.Client) -> str:
    """Where a report's image is still to be had: its image ID in the engine, else its published digest (the
    acceptance pulls it and checks the image ID), else "" (pins files have none)."""
    if side.image_id and engine.image_id(client, side.image_id) is not None:
        return side.image_id
    return (side.published or "") if side.image_id else ""


def differences(good: Side, bad: Side) -> list[str]:
    """Base and lock differences between GOOD and BAD: candidates of their own, never hidden."""
    out = []
    if good.pins.base.image != bad.pins.base.image:
        out.append(f"base.image: {good.pins.base.image} -> {bad.pins.base.image}")
    g, b = good.pins.lock_path(), bad.pins.lock_path()
    if g.is_file() and b.is_file() and g.read_bytes() != b.read_bytes():
        out.append(f"build.lock: {g} -> {b} differ")
    return out


def candidate_pins(pins: Pins, commits: dict[str, str], out_dir: Path, name: str = "") -> Pins:
    """BAD's pins with these commits, written in the bisect directory: absolute URLs, a copy of the lock, BAD's
    layer-cache scope (so each step rebuilds only the changed component's layer and those after it)."""
    data = pins_model.read_yaml(Path(str(pins.path)).read_text())
    for n, sha in commits.items():
        data["components"][n]["url"] = pins.component_url(n)
        data["components"][n]["commit"] = sha
    data["image"]["cache_scope"] = cache_scope(pins)
    lock = out_dir / "locks" / pins.lock_path().name
    lock.parent.mkdir(exist_ok=True)
    if not lock.is_file():
        lock.write_bytes(pins.lock_path().read_bytes())
    data["build"]["lock"] = f"locks/{lock.name}"
    digest = hashlib.sha256(repr(sorted(commits.items())).encode()).hexdigest()[:10]
    path = out_dir / (name or f"pins-{digest}.yaml")
    fs.write_atomic(path, yaml.safe_dump(data, sort_keys=False))
    return pins_model.load(path)
