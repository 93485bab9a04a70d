"""`python -m tinyrl.replay BUNDLE.json`: one step of the loop on a captured batch, nothing else.

The bundle (written by the acceptance gate from a tinyrl capture) holds the batch, the weights digest at that
step (the weights themselves when they are not the run's initial ones) and which comparison differed:
- logprobs: the engine's rollout logprobs of the batch against the trainer's logprobs of the same tokens;
- weights: the weights before against after one optimizer step at the bundle's lr (0 for zero_update), on
  the captured tokens (no rollout); the optimizer starts fresh, as at step 1.
Prints one JSON line: differs, count, the first differing positions and both sides' values there."""
import base64
import io
import json
import os
import sys

import torch
from tinycore import AdamW, TinyCore
from tinycore.utils import clip_grad_norm, params_checksum
from tinyengine import LLM, batch_invariant
from tinyengine import device as device_rule

from tinyrl import capture, checkpoint
from tinyrl.main_ppo import grpo_advantages, pg_loss
from tinyrl.reward import compute_reward

FIRST = 16


def _model(bundle):
    cfg = bundle["config"]
    torch.manual_seed(cfg["seed"])
    model = TinyCore(seed=cfg["seed"])
    if cfg.get("actor_rollout_ref.model.path"):
        model.load_state_dict(checkpoint.load_hf(cfg["actor_rollout_ref.model.path"]))
    weights = bundle["weights"]
    if weights.get("data"):
        model.load_state_dict(torch.load(io.BytesIO(base64.b64decode(weights["data"])), weights_only=True),
                              strict=False)
    return model


def _logprob_diffs(trainer, rollout):
    differ = (trainer != rollout).nonzero().tolist()
    return len(differ), [{"position": [r, t], "trainer": trainer[r, t].item(), "rollout": rollout[r, t].item()}
                         for r, t in differ[:FIRST]]


def replay(bundle) -> dict:
    cfg, batch = bundle["config"], bundle["batch"]
    model = _model(bundle)
    digest = params_checksum(model.named_parameters())
    if digest != bundle["weights"]["digest"]:
        return {"error": f"weights digest {digest} is not the bundle's {bundle['weights']['digest']}"}
    prompts = torch.tensor(batch["prompts"], dtype=torch.long)
    responses = torch.tensor(batch["responses"], dtype=torch.long)
    P, R = prompts.shape[1], responses.shape[1]
    result = {"kind": bundle["kind"], "step": bundle["step"], "weights": digest}
    if bundle["kind"] == "weights":  # the update alone: the batch's tokens are given, no rollout needed
        result["batch_invariant"] = batch_invariant.enabled()  # the engine's rule, as LLM() reads it
        device = device_rule.default()
    else:
        engine = LLM()
        result["batch_invariant"] = bool(getattr(engine, "batch_invariant", False))
        device = getattr(engine, "device", torch.device("cpu"))
    model.to(device)
    if bundle["kind"] == "logprobs":
        engine.load_weights(model.state_dict())
        out = engine.generate(prompts, max_tokens=R, seed=batch["sample_seed"])
        if not torch.equal(out.tokens, responses):
            return {**result, "differs": True, "kind": "responses", "count": int((out.tokens != responses).sum()),
                    "first": [], "note": "the engine sampled other tokens for this batch"}
    sequences = torch.cat([prompts, responses], 1).to(device)
    log_prob = model.token_logprobs(sequences, aligned=result["batch_invariant"])[:, P - 1:]
    if bundle["kind"] == "logprobs":
        count, first = _logprob_diffs(log_prob.detach().cpu(), out.logprobs)
        return {**result, "differs": count > 0, "count": count, "first": first}
    optim = AdamW(model.parameters(), lr=bundle["lr"], weight_decay=cfg["actor_rollout_ref.actor.optim.weight_decay"])
    advantages = grpo_advantages(compute_reward(prompts, responses), cfg["actor_rollout_ref.rollout.n"])
    advantages = advantages[:, None].expand(-1, R).to(device)
    loss = pg_loss(log_prob, log_prob.detach(), advantages, cfg["actor_rollout_ref.actor.clip_ratio"])
    optim.zero_grad()
    loss.backward()
    clip_grad_norm(model.parameters(), cfg["actor_rollout_ref.actor.grad_clip"])
    before = capture.snapshot(model)
    optim.step()
    moved = capture.changed(before, capture.snapshot(model))
    return {**result, "differs": moved["count"] > 0, "count": moved["count"], "first": moved["first"]}


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tinyrl.replay BUNDLE.json", file=sys.stderr)
        return 2
    with open(args[0]) as fh:
        bundle = json.load(fh)
    if "OMP_NUM_THREADS" not in os.environ:  # as main_ppo: one intra-op thread
        torch.set_num_threads(1)
    print(json.dumps(replay(bundle)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
