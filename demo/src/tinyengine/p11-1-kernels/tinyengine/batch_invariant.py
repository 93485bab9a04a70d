"""Batch-invariant kernels (the counterpart of VLLM_BATCH_INVARIANT).

Every op runs on one row and one position with a fixed shape: linear layers are
[1, d] @ W, attention for the query at position t is an elementwise product and a
sum over exactly t + 1 keys. A token's result therefore does not depend on the
batch size or on the row's place in the batch.
"""
import math
import os

import torch
import torch.nn.functional as F

ENV = "DEMO_BATCH_INVARIANT"


def enabled(environ=None) -> bool:
    value = (os.environ if environ is None else environ).get(ENV, "0").strip().lower()
    return value not in ("", "0", "false", "no", "off")


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


def prefill(p, cfg, prompts):
    caches, last = [], []
    for row in prompts.tolist():
        cache = [([], []) for _ in range(cfg.n_layers)]
        for pos, token in enumerate(row):
            lp = token_logprobs(p, cfg, token, pos, cache)
        caches.append(cache)
        last.append(lp)
    return caches, torch.cat(last)


def decode(p, cfg, caches, tokens, pos):
    return torch.cat([token_logprobs(p, cfg, t, pos, c) for t, c in zip(tokens.tolist(), caches)])
