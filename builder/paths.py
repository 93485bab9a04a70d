"""Where the tool keeps its caches: $BUILDER_CACHE, else <project>/.cache (builder/options.py)."""
from pathlib import Path

from builder.options import PROJECT, cache_root  # noqa: F401  (PROJECT is used by callers)


def cache_dir(*parts: str) -> Path:
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_path(*parts: str) -> Path:
    """Like cache_dir, but creates nothing (for lookups that may find nothing: --offline)."""
    return cache_root().joinpath(*parts)
