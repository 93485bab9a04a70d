"""Prompts and a verifiable reward."""
import torch


def make_prompts(seed: int, step: int, batch_size: int, length: int, vocab_size: int = 32):
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    return torch.randint(0, vocab_size, (batch_size, length), generator=g)


def compute_reward(prompts, responses, pad_id: int = 0):
    """Fraction of the non-padding response tokens with the parity of the prompt's first token."""
    valid = responses == pad_id
    hits = (responses % 2 == prompts[:, :1] % 2) & valid
    return hits.float().sum(1) / valid.float().sum(1)
