"""Package data, reached only through here (works from a checkout and from an installed wheel).

- templates: the jinja2 Dockerfile templates (`builder/image/templates/`; `dockerfiles/` links there)
- report templates: the jinja2 HTML of a run's report and the nightly history page (`builder/report/templates/`)
- image scripts: what the build copies into the image (`builder/image/scripts/`)
- scripts run in base containers (`builder/engine/scripts/`, `builder/lock/scripts/`)
- the pins JSON Schema (`builder/pins/schema/pins.schema.json`)
- the acceptance suite package (`acceptance/`), copied into every image
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _path(package: str, *parts: str) -> Path:
    path = Path(str(files(package))).joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"package data {package}/{'/'.join(parts)} is missing from this install")
    return path


def templates() -> Path:
    return _path("builder.image", "templates")


def report_templates() -> Path:
    return _path("builder.report", "templates")


def image_scripts() -> Path:
    return _path("builder.image", "scripts")


def container_script(package: str, name: str) -> str:
    """Text of a script run with the base's interpreter in a base container (`python -B -c`), e.g.
    builder/engine/scripts/base_query.py, builder/lock/scripts/lock_in_base.py."""
    return _path(f"builder.{package}", "scripts", name).read_text()


def pins_schema() -> Path:
    return _path("builder.pins", "schema", "pins.schema.json")


def acceptance_suite() -> Path:
    return _path("acceptance")
