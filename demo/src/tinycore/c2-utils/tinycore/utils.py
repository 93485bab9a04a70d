"""Training helpers."""
import hashlib
import struct

import torch


def clip_grad_norm(params, max_norm: float) -> float:
    """Scale gradients so their global L2 norm is at most max_norm; returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
    if max_norm > 0 and norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + 1e-6))
    return norm


def params_checksum(named_params) -> str:
    """sha256 (first 16 hex) of all parameters' float32 bytes in sorted-name order."""
    h = hashlib.sha256()
    for _, t in sorted(named_params, key=lambda kv: kv[0]):
        t = t.detach().to(torch.float32).flatten()
        h.update(struct.pack(f"<{t.numel()}f", *t.tolist()))
    return h.hexdigest()[:16]
