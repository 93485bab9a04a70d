"""Package data, reached only through here (works from a checkout and from an installed wheel).

- templates: the jinja2 Dockerfile templates (`dockerfiles/` in the checkout, `builder.dockerfiles` once installed)
- image scripts: what the build copies into the image (`builder/image_scripts/`)
- the pins JSON Schema (`builder/schema/pins.schema.json`)
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
    return _path("builder.dockerfiles")


def image_scripts() -> Path:
    return _path("builder", "image_scripts")


def pins_schema() -> Path:
    return _path("builder", "schema", "pins.schema.json")


def acceptance_suite() -> Path:
    return _path("acceptance")
