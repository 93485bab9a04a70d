"""Replay capture: with REPLAY_CAPTURE_DIR set, each step writes step_<N>.json as soon as it is done (a later
crash keeps it): the batch (prompt and response token IDs, the sampling seed), both sides' logprobs (trainer
and rollout, exact floats), the weight digests around the optimizer step and the first weights it changed.
Weights that are not the run's initial ones are saved beside it (step_<N>.weights, torch format) so the step
can be replayed alone (python -m tinyrl.replay)."""
import json
import os
import sys

import torch
from tinycore.utils import params_checksum

ENV = "REPLAY_CAPTURE_DIR"
FIRST = 16  # changed weight positions kept per step


def snapshot(model):
    """The parameters (name -> CPU copy): what params_checksum digests."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.named_parameters()}


def changed(before, after) -> dict:
    """Weights that differ between two state dicts: count and the first FIRST positions with both values."""
    count, first = 0, []
    for name in sorted(before):
        diff = (before[name] != after[name]).flatten().nonzero()[:, 0]
        count += diff.numel()
        for i in diff[:FIRST - len(first)].tolist():
            first.append({"tensor": name, "index": i, "before": before[name].flatten()[i].item(),
                          "after": after[name].flatten()[i].item()})
    return {"count": count, "first": first}


class Capture:
    def __init__(self, path: str, cfg: dict, model):
        self.path, self.cfg = path, cfg
        os.makedirs(path, exist_ok=True)
        self.initial = params_checksum(model.named_parameters())

    @classmethod
    def from_env(cls, cfg: dict, model):
        path = os.environ.get(ENV)
        return cls(path, cfg, model) if path else None

    def step(self, step, prompts, responses, sample_seed, trainer_logprobs, rollout_logprobs, before, model):
        after = snapshot(model)
        digest = params_checksum(before.items())
        record = {"step": step, "seed": self.cfg["seed"], "sample_seed": sample_seed,
                  "prompts": prompts.tolist(), "responses": responses.tolist(),
                  "trainer_logprobs": trainer_logprobs.tolist(), "rollout_logprobs": rollout_logprobs.tolist(),
                  "weights_before": digest, "weights_after": params_checksum(after.items()),
                  "initial_weights": self.initial, "weights_changed": changed(before, after),
                  "config": {k: self.cfg[k] for k in sorted(self.cfg) if not k.startswith("trainer.")},
                  "replay_entry": [sys.executable, "-m", "tinyrl.replay"]}
        if digest != self.initial:
            torch.save(before, os.path.join(self.path, f"step_{step}.weights"))
        with open(os.path.join(self.path, f"step_{step}.json.part"), "w") as fh:
            json.dump(record, fh)
        os.replace(os.path.join(self.path, f"step_{step}.json.part"), os.path.join(self.path, f"step_{step}.json"))
