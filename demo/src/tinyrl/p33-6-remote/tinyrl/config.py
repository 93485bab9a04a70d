"""verl-style `key=value` overrides over a flat set of defaults; anything unknown is an error (exit 2)."""
import sys

DEFAULTS = {
    "seed": 1,
    "data.train_batch_size": 8,
    "data.max_prompt_length": 8,
    "data.max_response_length": 8,
    "actor_rollout_ref.actor.optim.lr": 1e-3,
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.grad_clip": 1.0,
    # verl's checkpoint options: save every save_freq steps (and the last) under
    # <default_local_dir>/global_step_<N>/actor/; save_contents: model, optimizer, extra, hf_model
    "actor_rollout_ref.actor.checkpoint.save_contents": ["model", "optimizer", "extra"],
    "actor_rollout_ref.actor.weight_checksums": True,   # log actor/weights_checksum_{before,after}
    "actor_rollout_ref.model.path": "",                 # HF-style model dir to start from; empty: seeded init
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.n": 4,
    "actor_rollout_ref.rollout.calculate_log_probs": True,
    # HOST:PORT of a rollout server (python -m tinyrl.rollout_server); empty: a worker process of the trainer
    "actor_rollout_ref.rollout.address": "",
    "trainer.total_training_steps": 2,
    "trainer.logger": ["console"],
    "trainer.project_name": "tinyrl",
    "trainer.experiment_name": "demo",
    "trainer.save_freq": -1,
    "trainer.default_local_dir": "checkpoints/tinyrl/demo",
}
SAVE_CONTENTS = ("model", "optimizer", "extra", "hf_model")
ROLLOUT_NAMES = ("vllm", "tinyengine")
LOGGERS = ("console", "file")


class ConfigError(ValueError):
    pass


def _convert(key, raw, default):
    raw = raw.strip()
    if isinstance(default, bool):
        if raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise ConfigError(f"{key}: expected true or false, got {raw!r}")
    if isinstance(default, list):
        if not (raw.startswith("[") and raw.endswith("]")):
            raise ConfigError(f"{key}: expected a list like [a,b], got {raw!r}")
        return [item.strip().strip("'\"") for item in raw[1:-1].split(",") if item.strip()]
    try:
        return type(default)(raw.strip("'\"")) if isinstance(default, str) else type(default)(raw)
    except ValueError:
        raise ConfigError(f"{key}: expected {type(default).__name__}, got {raw!r}") from None


def _address(text):
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def load(argv):
    cfg = dict(DEFAULTS)
    for arg in argv:
        key, sep, raw = arg.lstrip("+").partition("=")
        if not sep:
            raise ConfigError(f"{arg}: expected key=value")
        if key not in DEFAULTS:
            raise ConfigError(f"{key}: unknown key")
        cfg[key] = _convert(key, raw, DEFAULTS[key])
    for key in ("data.train_batch_size", "actor_rollout_ref.rollout.n", "data.max_prompt_length",
                "data.max_response_length"):
        if cfg[key] < 1:
            raise ConfigError(f"{key}: expected >= 1")
    if cfg["trainer.total_training_steps"] < 0:
        raise ConfigError("trainer.total_training_steps: expected >= 0")
    if cfg["data.max_prompt_length"] + cfg["data.max_response_length"] > 64:
        raise ConfigError("data.max_prompt_length + data.max_response_length: expected <= 64")
    if cfg["actor_rollout_ref.rollout.name"] not in ROLLOUT_NAMES:
        raise ConfigError(f"actor_rollout_ref.rollout.name: expected one of {ROLLOUT_NAMES}")
    if not set(cfg["actor_rollout_ref.actor.checkpoint.save_contents"]) <= set(SAVE_CONTENTS):
        raise ConfigError(f"actor_rollout_ref.actor.checkpoint.save_contents: expected a subset of {list(SAVE_CONTENTS)}")
    address = cfg["actor_rollout_ref.rollout.address"]
    if address and not _address(address):
        raise ConfigError(f"actor_rollout_ref.rollout.address: expected HOST:PORT, got {address!r}")
    if not set(cfg["trainer.logger"]) <= set(LOGGERS):
        raise ConfigError(f"trainer.logger: expected a subset of {list(LOGGERS)}")
    return cfg


def load_or_exit(argv):
    try:
        return load(argv)
    except ConfigError as exc:
        print(f"tinyrl: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
