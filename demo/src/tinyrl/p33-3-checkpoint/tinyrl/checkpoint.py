"""Checkpoints in verl's layout: <dir>/global_step_<N>/actor/ with
model_world_size_1_rank_0.pt (model), optim_world_size_1_rank_0.pt (optimizer),
extra_state_world_size_1_rank_0.pt (extra) and huggingface/ (hf_model: config.json + pytorch_model.bin);
<dir>/latest_checkpointed_iteration.txt names the last step saved."""
import json
import os

import torch

HF_WEIGHTS = "pytorch_model.bin"


def save_hf(directory, model):
    """An HF-style model directory: config.json and the state_dict as pytorch_model.bin."""
    os.makedirs(directory, exist_ok=True)
    config = {"model_type": "tinycore", **{k: getattr(model.config, k) for k in model.config.__dataclass_fields__}}
    with open(os.path.join(directory, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2, sort_keys=True)
    torch.save(model.state_dict(), os.path.join(directory, HF_WEIGHTS))


def load_hf(directory):
    """The state_dict of an HF-style model directory written by save_hf."""
    return torch.load(os.path.join(directory, HF_WEIGHTS), map_location="cpu", weights_only=True)


def save(root, step, model, optim, contents):
    actor = os.path.join(root, f"global_step_{step}", "actor")
    os.makedirs(actor, exist_ok=True)
    if "model" in contents:
        torch.save(model.state_dict(), os.path.join(actor, "model_world_size_1_rank_0.pt"))
    if "optimizer" in contents:
        names = {id(p): n for n, p in model.named_parameters()}
        state = {names[k]: {"exp_avg": m, "exp_avg_sq": v} for k, (m, v) in optim.state.items()}
        torch.save({"state": state, "param_groups": optim.param_groups, "steps": optim.steps},
                   os.path.join(actor, "optim_world_size_1_rank_0.pt"))
    if "extra" in contents:
        torch.save({"rng": torch.get_rng_state(), "global_step": step},
                   os.path.join(actor, "extra_state_world_size_1_rank_0.pt"))
    if "hf_model" in contents:
        save_hf(os.path.join(actor, "huggingface"), model)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as fh:
        fh.write(str(step))
