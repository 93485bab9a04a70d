"""Aligned forward: the rollout engine's batch-invariant kernels, reproduced.

The same fixed-layout reductions as the engine's DEMO_BATCH_INVARIANT=1 path: a linear
layer is an elementwise product and a sum over the input dim ((x[..., :, None] * W).sum(-2)),
attention always spans all max_seq_len key slots (later ones masked to probability 0,
their values zero). Each token's logprob is computed in exactly the same order as in
the engine's prefill or decode, so training logprobs equal rollout logprobs bitwise.
This is a copy of the math, not an import of the engine.

On a GPU, as in the engine, every sum is a chain of elementwise multiply-adds over k = 0, 1, ...
in order (no cuBLAS, no library reduction), so the order is the engine's whatever the shapes.
"""
import math

import torch
import torch.nn.functional as F

CHUNK = 2 ** 17  # elements of one product temporary


def _dot(a, b):
    """GPU: sum over the last dim of a * b (broadcast), k = 0, 1, ... in order."""
    acc = a[..., 0] * b[..., 0]
    for k in range(1, a.shape[-1]):
        acc = torch.addcmul(acc, a[..., k], b[..., k])
    return acc


def _total(x):
    """GPU: sum over the last dim, k = 0, 1, ... in order (keepdim)."""
    acc = x[..., 0]
    for k in range(1, x.shape[-1]):
        acc = acc + x[..., k]
    return acc[..., None]


def softmax(x):
    if not x.is_cuda:
        return torch.softmax(x, dim=-1)
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / _total(e)


def log_softmax(x):
    if not x.is_cuda:
        return torch.log_softmax(x, dim=-1)
    shifted = x - x.amax(-1, keepdim=True)
    return shifted - _total(shifted.exp()).log()


def linear(x, w):
    """[..., din] x [din, dout]: every output is an elementwise product and a sum over din,
    over fixed-size row chunks (bounded temporaries; a row's result never depends on its chunk)."""
    if x.is_cuda:
        return _dot(x[..., None, :], w.t())
    rows = x.reshape(-1, x.shape[-1])
    out = torch.cat([(r.unsqueeze(-1) * w).sum(-2) for r in rows.split(max(1, CHUNK // w.numel()))])
    return out.view(*x.shape[:-1], w.shape[1])


def rms_norm(x, w, eps):
    if x.is_cuda:
        return x * torch.rsqrt(_dot(x, x)[..., None] / x.shape[-1] + eps) * w
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def attend(q, k, v, scale):
    """q, k, v: [B, H, T, hd], causal -> [B, H, T, hd]; keys padded to max_seq_len slots like the engine's cache."""
    T, S = q.shape[2], k.shape[2]
    if q.is_cuda:
        scores = _dot(q.unsqueeze(-2), k.unsqueeze(-3)) * scale
    else:
        scores = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * scale  # [B, H, T, S]
    future = torch.arange(S, device=q.device) > torch.arange(T, device=q.device)[:, None]
    probs = softmax(scores.masked_fill(future, float("-inf")))
    if q.is_cuda:
        return _dot(probs.unsqueeze(-2), v.transpose(-1, -2).unsqueeze(-3))
    return (probs.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)


def sequence_logprobs(p, cfg, tokens):
    """p: name -> tensor (autograd flows through); tokens [B, T] -> [B, T-1]."""
    B, T = tokens.shape
    d, scale = cfg.d_model, 1.0 / math.sqrt(cfg.head_dim)

    def heads(y, slots):  # [B, T, d] -> [B, H, slots, hd], zero-padded after T
        return F.pad(y.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2), (0, 0, 0, slots - T))

    x = p["tok_emb.weight"][tokens] + p["pos_emb.weight"][:T]
    for i in range(cfg.n_layers):
        pre = f"layers.{i}."
        h = rms_norm(x, p[pre + "attn_norm.weight"], cfg.eps)
        wqkv = torch.cat([p[pre + "attn.wq"], p[pre + "attn.wk"], p[pre + "attn.wv"]], 1)
        q, k, v = linear(h, wqkv).split(d, -1)
        q, k, v = heads(q, T), heads(k, cfg.max_seq_len), heads(v, cfg.max_seq_len)
        att = attend(q, k, v, scale)
        x = x + linear(att.transpose(1, 2).reshape(B, T, d), p[pre + "attn.wo"])
        h = rms_norm(x, p[pre + "mlp_norm.weight"], cfg.eps)
        x = x + linear(F.gelu(linear(h, p[pre + "mlp.w_in"])), p[pre + "mlp.w_out"])
    h = rms_norm(x[:, :-1], p["norm.weight"], cfg.eps)
    logp = log_softmax(linear(h, p["lm_head.weight"]))
    return logp.gather(-1, tokens[:, 1:, None])[..., 0]
