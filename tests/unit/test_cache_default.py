"""The default cache root: a checkout (editable install) uses <checkout>/.cache, an installed wheel
~/.cache/rl-image-builder; BUILDER_CACHE wins over both; the docs name cache files the code writes."""
from __future__ import annotations

import re
from pathlib import Path

from builder.core import options

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "DESIGN.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_this_checkout_uses_its_own_cache_dir() -> None:
    assert options.PACKAGE == ROOT / "builder" / "core"
    assert options._default_cache() == ROOT / ".cache"
    assert options.Settings.from_env({}).cache_root == ROOT / ".cache"


def test_a_checkout_and_an_installed_wheel(tmp_path: Path) -> None:
    checkout = tmp_path / "clone"
    (checkout / "builder" / "core").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("[project]\nname = 'rl-image-builder'\n")
    (checkout / "builder" / "cli.py").write_text("")
    assert options._default_cache(checkout / "builder" / "core", tmp_path / "home") == checkout / ".cache"
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "builder" / "core").mkdir(parents=True)
    (site / "builder" / "cli.py").write_text("")
    home = tmp_path / "home"
    assert options._default_cache(site / "builder" / "core", home) == home / ".cache" / "rl-image-builder"


def test_builder_cache_wins(tmp_path: Path) -> None:
    assert options.Settings.from_env({"BUILDER_CACHE": str(tmp_path)}).cache_root == tmp_path


def test_every_cache_path_in_the_docs_is_one_the_code_writes() -> None:
    """`.cache/<dir>/...` in the docs: .cache is this checkout's default, <dir> a settings.cache() folder of the
    code, and a file name given in full is one the code writes there."""
    code = "\n".join(p.read_text() for d in ("builder", "demo") for p in sorted((ROOT / d).rglob("*.py")))
    named = 0
    for doc in DOCS:
        for path in re.findall(r"(?<![~\w/])\.cache/([\w./<>-]+)", doc.read_text()):
            named += 1
            folder, _, rest = path.partition("/")
            assert re.search(rf'\.cache\(\s*"{re.escape(folder)}"', code), f"{doc.name}: .cache/{path}: no such folder"
            name = rest.rsplit("/", 1)[-1]
            if name and "<" not in name:
                assert f'"{name}"' in code, f"{doc.name}: .cache/{path}: the code writes no {name}"
    assert named >= 2
    assert (options._default_cache().name, options._default_cache().parent) == (".cache", ROOT)
