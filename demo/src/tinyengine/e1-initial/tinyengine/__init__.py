"""tinyengine: a tiny decoder-only inference engine."""
from tinyengine._version import __version__  # written by setuptools-scm at build time

from tinyengine.config import ModelConfig  # noqa: E402
from tinyengine.engine import LLM, GenerationOutput  # noqa: E402

__all__ = ["LLM", "GenerationOutput", "ModelConfig", "__version__"]
