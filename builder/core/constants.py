"""Project constants, each defined once (the suite's own names come from acceptance.defaults)."""
from acceptance.defaults import CACHE_ENV_VARS, DEFAULT_REQUIRED, GATES, METRICS
from builder import __version__

__all__ = ["BUILDER_VERSION", "CACHE_DIR", "CACHE_ENV", "CACHE_ENV_VARS", "CACHE_KEY_LABEL", "COMPONENTS",
           "DEFAULT_REQUIRED", "GATES", "LABEL_PREFIX", "MANIFEST", "METRICS", "SOURCE_DATE_EPOCH", "TOOL_URI"]

BUILDER_VERSION = __version__
TOOL_URI = "https://github.com/truepolicy/rl-image-builder"

# install order: the inference engine, the training core, the RL orchestrator
COMPONENTS = ("vllm", "megatron", "verl")

# fixed mtime of every context file and SOURCE_DATE_EPOCH of the build (2000-01-01; zip needs >= 1980)
SOURCE_DATE_EPOCH = 946684800

LABEL_PREFIX = "io.truepolicy"
# first instruction of each stage built on the base (`<pins key>.<stage>`): keys the engine's layer cache to the
# pins (another run's identical layer on the same base is never this run's cache parent); normalisation drops it
CACHE_KEY_LABEL = f"{LABEL_PREFIX}.cache-key"
MANIFEST = "/opt/delivery/manifest.json"

# acceptance containers: compile/JIT caches on an empty tmpfs
CACHE_DIR = "/cache"
CACHE_ENV = {
    "HOME": CACHE_DIR,
    "XDG_CACHE_HOME": f"{CACHE_DIR}/xdg",
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/inductor",
    "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
    "VLLM_CACHE_ROOT": f"{CACHE_DIR}/vllm",
    "TORCH_EXTENSIONS_DIR": f"{CACHE_DIR}/torch_extensions",
    "CUDA_CACHE_PATH": f"{CACHE_DIR}/nv",
    "PYTHONUNBUFFERED": "1",
}
