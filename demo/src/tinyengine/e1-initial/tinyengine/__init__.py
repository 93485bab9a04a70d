"""tinyengine: a tiny decoder-only inference engine."""
__version__ = "0.2.0"

from tinyengine.config import ModelConfig  # noqa: E402
from tinyengine.engine import LLM, GenerationOutput  # noqa: E402

__all__ = ["LLM", "GenerationOutput", "ModelConfig", "__version__"]
