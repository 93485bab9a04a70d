"""`python -m tinyrl.main_ppo key=value ...`: GRPO with tinyengine rollouts and tinycore training."""
import os
import sys
import time

import torch
from tinycore import AdamW, TinyCore
from tinycore.utils import clip_grad_norm, params_checksum

from tinyrl import capture, checkpoint, config
from tinyrl.logger import Tracking
from tinyrl.metrics import rollout_mismatch_metrics
from tinyrl.reward import compute_reward, make_prompts
from tinyrl.rollout import RemoteRollout, RolloutWorker

os.environ.setdefault("TINYCORE_FAST_LINEAR", "1")  # tinycore PR 25's faster linear in the trainer


def grpo_advantages(rewards, n: int, eps: float = 1e-6):
    """Group-normalised advantages: (r - mean) / (std + eps) within each prompt's n responses."""
    if n == 1:
        return torch.zeros_like(rewards)
    r = rewards.view(-1, n)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def pg_loss(log_prob, old_log_prob, advantages, clip_ratio: float):
    """PPO clipped surrogate, token-mean over response tokens."""
    ratio = torch.exp(log_prob - old_log_prob)
    losses = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip_ratio, 1 + clip_ratio))
    return losses.mean()


def run(cfg):
    seed, P, R = cfg["seed"], cfg["data.max_prompt_length"], cfg["data.max_response_length"]
    n = cfg["actor_rollout_ref.rollout.n"]
    torch.manual_seed(seed)
    model = TinyCore(seed=seed)
    if cfg["actor_rollout_ref.model.path"]:
        model.load_state_dict(checkpoint.load_hf(cfg["actor_rollout_ref.model.path"]))
    optim = AdamW(model.parameters(), lr=cfg["actor_rollout_ref.actor.optim.lr"],
                  weight_decay=cfg["actor_rollout_ref.actor.optim.weight_decay"])
    address = cfg["actor_rollout_ref.rollout.address"]
    # the engine in its own process, as verl's rollout workers (tinyrl/rollout.py): a worker of this process, or
    # a rollout server at HOST:PORT, maybe on another node
    engine = RemoteRollout(address) if address else RolloutWorker()
    device = getattr(engine, "device", torch.device("cpu"))
    model.to(device)  # trainer and engine on one device; prompts, rewards and logged values on the CPU
    engine.load_weights(model.state_dict())
    batch_invariant = bool(getattr(engine, "batch_invariant", False))
    replay = capture.Capture.from_env(cfg, model)  # None unless REPLAY_CAPTURE_DIR is set
    tracker = Tracking(cfg["trainer.project_name"], cfg["trainer.experiment_name"], cfg["trainer.logger"])
    for step in range(1, cfg["trainer.total_training_steps"] + 1):
        t_step = time.perf_counter()
        prompts = make_prompts(seed, step, cfg["data.train_batch_size"], P).repeat_interleave(n, 0)
        t0 = time.perf_counter()
        sample_seed = seed * 1_000_003 + step * 10_007
        tokens, rollout_logprobs = engine.generate(prompts, max_tokens=R, seed=sample_seed)
        t_gen, cpu_gen = time.perf_counter() - t0, engine.cpu_s  # the worker's CPU time
        rewards = compute_reward(prompts, tokens)
        advantages = grpo_advantages(rewards, n)[:, None].expand(-1, R).to(device)

        t0 = time.perf_counter()
        # old_log_prob: the trainer's forward on the full sequence; with a batch-invariant
        # engine the aligned forward reproduces the engine's kernels.
        sequences = torch.cat([prompts, tokens], 1).to(device)
        log_prob = model.token_logprobs(sequences, aligned=batch_invariant)[:, P - 1:]
        old_log_prob = log_prob.detach()
        loss = pg_loss(log_prob, old_log_prob, advantages, cfg["actor_rollout_ref.actor.clip_ratio"])
        optim.zero_grad()
        loss.backward()
        grad_norm = clip_grad_norm(model.parameters(), cfg["actor_rollout_ref.actor.grad_clip"])
        checksums = cfg["actor_rollout_ref.actor.weight_checksums"]
        weights_before = params_checksum(model.named_parameters()) if checksums else None
        before = capture.snapshot(model) if replay else None
        optim.step()
        weights_after = params_checksum(model.named_parameters()) if checksums else None
        t_update = time.perf_counter() - t0
        engine.load_weights(model.state_dict())  # weight sync: the next rollout sees this update
        if replay:
            replay.step(step, prompts, tokens, sample_seed, old_log_prob.cpu(), rollout_logprobs, before, model)

        save_freq, last = cfg["trainer.save_freq"], step == cfg["trainer.total_training_steps"]
        if save_freq > 0 and (step % save_freq == 0 or last):  # as verl's trainer: every save_freq and the last
            checkpoint.save(cfg["trainer.default_local_dir"], step, model, optim,
                            cfg["actor_rollout_ref.actor.checkpoint.save_contents"])

        tokens_per_s = tokens.numel() / t_gen
        metrics = {}
        if checksums:
            metrics.update({"actor/weights_checksum_before": weights_before,
                            "actor/weights_checksum_after": weights_after})
        if cfg["actor_rollout_ref.rollout.calculate_log_probs"]:
            metrics.update(rollout_mismatch_metrics(old_log_prob.cpu(), rollout_logprobs))
        tracker.log({
            **metrics,
            "rollout/batch_invariant": int(batch_invariant),
            "training/global_step": step,
            "actor/pg_loss": loss.item(),
            "actor/grad_norm": grad_norm,
            "actor/lr": optim.param_groups[0]["lr"],
            "critic/rewards/mean": rewards.mean().item(),
            "critic/advantages/mean": advantages.mean().item(),
            "response_length/mean": float(R),
            "perf/rollout_tokens_per_s": tokens_per_s,
            "rollout/throughput_tokens_per_s": tokens_per_s,
            # per second of the rollout worker's CPU time: steadier than wall time on a shared host
            "perf/rollout_tokens_per_cpu_s": tokens.numel() / max(cpu_gen, 1e-9),
            "timing_s/gen": t_gen,
            "timing_s/update_actor": t_update,
            "timing_s/step": time.perf_counter() - t_step,
        }, step)
    tracker.close()
    engine.close()
    return 0


def main(argv=None):
    cfg = config.load_or_exit(sys.argv[1:] if argv is None else argv)
    if "OMP_NUM_THREADS" not in os.environ:  # one intra-op thread per worker, as torchrun sets it
        torch.set_num_threads(1)
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
