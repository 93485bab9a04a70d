"""Batched kernels: prefill over all prompt rows at once, decode over the batch at once.
On a GPU every linear layer is one batched cuBLAS GEMM, whose blocking and split-K depend on the
number of rows: a row's result may change with the batch size (not batch-invariant)."""
import math

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _heads(x, B, T, cfg):  # [B*T, d] -> [B, H, T, hd]
    return x.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)


def _layers(p, cfg, x, cache, start):
    """x: [B, T, d] for positions start..start+T-1; cache: (K, V) lists of [B, H, Tmax, hd]."""
    B, T, d = x.shape
    scale = 1.0 / math.sqrt(cfg.head_dim)
    for i in range(cfg.n_layers):
        pre = f"layers.{i}."
        h = rms_norm(x, p[pre + "attn_norm.weight"], cfg.eps).reshape(B * T, d)
        q = _heads(h @ p[pre + "attn.wq"], B, T, cfg)
        cache[0][i][:, :, start:start + T] = _heads(h @ p[pre + "attn.wk"], B, T, cfg)
        cache[1][i][:, :, start:start + T] = _heads(h @ p[pre + "attn.wv"], B, T, cfg)
        k = cache[0][i][:, :, :start + T]
        v = cache[1][i][:, :, :start + T]
        scores = (q @ k.transpose(-1, -2)) * scale  # [B, H, T, start+T]
        if T > 1:
            mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
            scores = scores.masked_fill(~mask, float("-inf"))
        att = torch.softmax(scores, dim=-1) @ v  # [B, H, T, hd]
        x = x + (att.transpose(1, 2).reshape(B * T, d) @ p[pre + "attn.wo"]).view(B, T, d)
        h = rms_norm(x, p[pre + "mlp_norm.weight"], cfg.eps).reshape(B * T, d)
        x = x + (F.gelu(h @ p[pre + "mlp.w_in"]) @ p[pre + "mlp.w_out"]).view(B, T, d)
    return x


def _last_logprobs(p, cfg, x):
    h = rms_norm(x[:, -1], p["norm.weight"], cfg.eps)
    return torch.log_softmax(h @ p["lm_head.weight"], dim=-1)  # [B, V]


def prefill(p, cfg, prompts):
    """prompts: [B, Tp] -> (state, logprobs of the next token [B, V])."""
    B, T = prompts.shape
    shape = (B, cfg.n_heads, cfg.max_seq_len, cfg.head_dim)
    dev = prompts.device
    cache = ([torch.zeros(shape, device=dev) for _ in range(cfg.n_layers)],
             [torch.zeros(shape, device=dev) for _ in range(cfg.n_layers)])
    x = p["tok_emb.weight"][prompts] + p["pos_emb.weight"][:T]
    return cache, _last_logprobs(p, cfg, _layers(p, cfg, x, cache, 0))


def decode(p, cfg, cache, tokens, pos):
    """tokens: [B] at position pos -> logprobs of the next token [B, V]."""
    x = (p["tok_emb.weight"][tokens] + p["pos_emb.weight"][pos]).unsqueeze(1)
    return _last_logprobs(p, cfg, _layers(p, cfg, x, cache, pos))
