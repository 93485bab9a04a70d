"""Train/rollout mismatch metrics (verl's training/rollout_probs_diff_* and rollout_corr/*)."""
import torch


def rollout_mismatch_metrics(old_log_prob, rollout_log_prob, response_mask=None) -> dict:
    """old_log_prob: trainer logprobs; rollout_log_prob: engine logprobs; both [B, R]."""
    valid = torch.ones_like(old_log_prob, dtype=torch.bool) if response_mask is None else response_mask.bool()
    old, rollout = old_log_prob.double()[valid], rollout_log_prob.double()[valid]
    diff = (old.exp() - rollout.exp()).abs()
    r = old - rollout  # log ratio, trainer over rollout
    return {
        "training/rollout_probs_diff_valid": 1,
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std(unbiased=False).item(),
        "rollout_corr/kl": (-r).mean().item(),
    }
