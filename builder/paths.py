"""Where the tool keeps its caches: $BUILDER_CACHE, else <project>/.cache."""
import os
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def cache_dir(*parts: str) -> Path:
    root = Path(os.environ.get("BUILDER_CACHE") or PROJECT / ".cache")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
