"""tinycore: a tiny training core."""
__version__ = "0.3.0"

from tinycore.config import ModelConfig  # noqa: E402
from tinycore.model import TinyCore  # noqa: E402
from tinycore.optim import AdamW  # noqa: E402

__all__ = ["AdamW", "ModelConfig", "TinyCore", "__version__"]
