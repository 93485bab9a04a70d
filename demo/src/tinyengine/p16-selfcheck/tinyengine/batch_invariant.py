"""Batch-invariant kernels (the counterpart of VLLM_BATCH_INVARIANT).

Vectorised over rows and positions, but every reduction has a fixed layout that does
not depend on the batch: a linear layer is an elementwise product and a sum over the
input dim ((x[..., :, None] * W).sum(-2), never a GEMM whose blocking depends on the
number of rows), and attention always spans all max_seq_len key slots (later slots
masked to probability 0, their values zero). A token's result therefore does not depend
on the batch size, on the row's place in the batch, or on prefill vs decode.

On a GPU no library reduction is trusted (cuBLAS and the reduction kernels pick their blocking
and split from the shapes): every sum (linear, attention, RMS norm, softmax) runs in the Triton
kernels of tinyengine.triton_ops, one configuration each, never picked from the shapes: a matmul
output is a multiply-add chain over k = 0, 1, ... in order, a row's norm or softmax one fixed tree
over the row. An output's reduction order is fixed by construction, whatever the number of rows.
"""
import math
import os

from tinyengine import _kernels  # built with CMake from the fetched tinykernels library

import torch
import torch.nn.functional as F

CHUNK = 2 ** 17  # elements of one product temporary

ENV = "DEMO_BATCH_INVARIANT"


def enabled(environ=None) -> bool:
    """The switch, read through the native tinykernels rule ("", 0, false, no, off are off)."""
    return _kernels.switch_on((os.environ if environ is None else environ).get(ENV, "0"))


def _gpu():
    """The Triton kernels, imported on first GPU use only (the CPU path never needs Triton)."""
    from tinyengine import triton_ops

    return triton_ops


def softmax(x):
    if not x.is_cuda:
        return torch.softmax(x, dim=-1)
    return _gpu().softmax(x)


def log_softmax(x):
    if not x.is_cuda:
        return torch.log_softmax(x, dim=-1)
    return _gpu().log_softmax(x)


def linear(x, w):
    """[..., din] x [din, dout]: every output is an elementwise product and a sum over din,
    over fixed-size row chunks (bounded temporaries; a row's result never depends on its chunk)."""
    if x.is_cuda:
        return _gpu().linear(x, w)
    rows = x.reshape(-1, x.shape[-1])
    out = torch.cat([(r.unsqueeze(-1) * w).sum(-2) for r in rows.split(max(1, CHUNK // w.numel()))])
    return out.view(*x.shape[:-1], w.shape[1])


def rms_norm(x, w, eps):
    if x.is_cuda:
        return _gpu().rms_norm(x, w, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def attend(q, k, v, start, scale):
    """q: [B, H, T, hd] at positions start..start+T-1; k, v: [B, H, max_seq_len, hd] -> [B, H, T, hd]."""
    T, S = q.shape[2], k.shape[2]
    if q.is_cuda:
        scores = _gpu().scores(q, k) * scale
    else:
        scores = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * scale  # [B, H, T, S]
    future = torch.arange(S, device=q.device) > torch.arange(start, start + T, device=q.device)[:, None]
    probs = softmax(scores.masked_fill(future, float("-inf")))
    if q.is_cuda:
        return _gpu().mix(probs, v)
    return (probs.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)


def _heads(x, cfg):  # [B, T, d] -> [B, H, T, hd]
    return x.view(*x.shape[:2], cfg.n_heads, cfg.head_dim).transpose(1, 2)


def _layers(p, cfg, x, cache, start):
    """x: [B, T, d] for positions start..start+T-1; cache: (K, V) lists of [B, H, max_seq_len, hd]."""
    B, T, d = x.shape
    scale = 1.0 / math.sqrt(cfg.head_dim)
    for i in range(cfg.n_layers):
        pre = f"layers.{i}."
        h = rms_norm(x, p[pre + "attn_norm.weight"], cfg.eps)
        wqkv = torch.cat([p[pre + "attn.wq"], p[pre + "attn.wk"], p[pre + "attn.wv"]], 1)
        q, k, v = (_heads(y, cfg) for y in linear(h, wqkv).split(d, -1))
        cache[0][i][:, :, start:start + T] = k
        cache[1][i][:, :, start:start + T] = v
        att = attend(q, cache[0][i], cache[1][i], start, scale)
        x = x + linear(att.transpose(1, 2).reshape(B, T, d), p[pre + "attn.wo"])
        h = rms_norm(x, p[pre + "mlp_norm.weight"], cfg.eps)
        x = x + _mlp(p, pre, h, check=T == 1)
    return x


def _mlp(p, pre, h, check):
    """The MLP; at a decode step (check) it runs twice and the two results must be bitwise equal: a cheap
    determinism self-check of the fixed reduction order (about 1.2x the decode CPU time)."""
    out = linear(F.gelu(linear(h, p[pre + "mlp.w_in"])), p[pre + "mlp.w_out"])
    if check and not torch.equal(out, linear(F.gelu(linear(h, p[pre + "mlp.w_in"])), p[pre + "mlp.w_out"])):
        raise RuntimeError("batch_invariant: the MLP gave two results for one input")
    return out


def _last_logprobs(p, cfg, x):
    h = rms_norm(x[:, -1], p["norm.weight"], cfg.eps)
    return log_softmax(linear(h, p["lm_head.weight"]))  # [B, V]


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
