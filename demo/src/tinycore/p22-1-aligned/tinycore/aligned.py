"""Aligned forward: the rollout engine's batch-invariant kernels, reproduced.

Each position of each row runs as its own fixed-shape computation ([1, d] @ W,
attention as an elementwise product and a sum over exactly t + 1 keys), the same
math as the engine's DEMO_BATCH_INVARIANT=1 path, so training logprobs equal
rollout logprobs bitwise. This is a copy of the math, not an import of the engine.
"""
import math

import torch
import torch.nn.functional as F


def rms_norm_row(x, w, eps):  # x: [1, d]
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def attend(q, ks, vs, scale):
    """q: [H, hd]; ks, vs: lists of [H, hd] for positions 0..t -> [H, hd]."""
    k = torch.stack(ks, dim=1)  # [H, t+1, hd]
    v = torch.stack(vs, dim=1)
    probs = torch.softmax((q.unsqueeze(1) * k).sum(-1) * scale, dim=-1)  # [H, t+1]
    return (probs.unsqueeze(-1) * v).sum(1)


def token_logprobs(p, cfg, token: int, pos: int, cache):
    """One token of one row; cache: per layer (keys, values) lists, extended in place -> [1, V]."""
    H, hd, d = cfg.n_heads, cfg.head_dim, cfg.d_model
    scale = 1.0 / math.sqrt(hd)
    x = (p["tok_emb.weight"][token] + p["pos_emb.weight"][pos]).unsqueeze(0)
    for i in range(cfg.n_layers):
        pre = f"layers.{i}."
        h = rms_norm_row(x, p[pre + "attn_norm.weight"], cfg.eps)
        q = (h @ p[pre + "attn.wq"]).view(H, hd)
        cache[i][0].append((h @ p[pre + "attn.wk"]).view(H, hd))
        cache[i][1].append((h @ p[pre + "attn.wv"]).view(H, hd))
        x = x + attend(q, cache[i][0], cache[i][1], scale).reshape(1, d) @ p[pre + "attn.wo"]
        h = rms_norm_row(x, p[pre + "mlp_norm.weight"], cfg.eps)
        x = x + F.gelu(h @ p[pre + "mlp.w_in"]) @ p[pre + "mlp.w_out"]
    h = rms_norm_row(x, p["norm.weight"], cfg.eps)
    return torch.log_softmax(h @ p["lm_head.weight"], dim=-1)


def sequence_logprobs(p, cfg, tokens):
    """p: name -> tensor (autograd flows through); tokens [B, T] -> [B, T-1]."""
    rows = []
    for row in tokens.tolist():
        cache = [([], []) for _ in range(cfg.n_layers)]
        lps = [token_logprobs(p, cfg, row[t], t, cache)[0, row[t + 1]] for t in range(len(row) - 1)]
        rows.append(torch.stack(lps))
    return torch.stack(rows)
