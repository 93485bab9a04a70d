"""Names the suite and the builder share, defined once (stdlib only: this runs inside the image)."""

GATES = ("provenance", "zero_update", "rl_step", "control", "performance")
# required unless the pins say otherwise; performance is required when the pins name acceptance.performance
DEFAULT_REQUIRED = ("provenance", "zero_update", "rl_step", "control")

# metric names the gates read, verl's by default (the pins may rename each)
METRICS = {
    "diff_max": "training/rollout_probs_diff_max",
    "diff_mean": "training/rollout_probs_diff_mean",
    "k3_kl": "rollout_corr/k3_kl",
    "reward": "critic/rewards/mean",
    "loss": "actor/pg_loss",
    "weights_before": "actor/weights_checksum_before",
    "weights_after": "actor/weights_checksum_after",
    "throughput": "perf/throughput",  # verl: tokens/s per GPU over the whole step
}

# compile/JIT cache variables: pointed at the container's tmpfs, and checked empty by provenance
CACHE_ENV_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME",
                  "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH")
