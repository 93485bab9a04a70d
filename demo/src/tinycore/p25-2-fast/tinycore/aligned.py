"""Aligned forward: the rollout engine's batch-invariant kernels, reproduced.

The same fixed-layout reductions as the engine's DEMO_BATCH_INVARIANT=1 path: a linear
layer is an elementwise product and a sum over the input dim ((x[..., :, None] * W).sum(-2)),
attention always spans all max_seq_len key slots (later ones masked to probability 0,
their values zero). Each token's logprob is computed in exactly the same order as in
the engine's prefill or decode, so training logprobs equal rollout logprobs bitwise.
This is a copy of the math, not an import of the engine.

On a GPU the forward calls the engine's own Triton kernels (tinyengine.triton_ops: the same kernels,
the same fixed reduction order, so the same bits); the backward recomputes each op with plain torch ops
(gradients need no batch invariance, only the forward values must be the engine's).
"""
import math
import os

import torch
import torch.nn.functional as F

CHUNK = 2 ** 17  # elements of one product temporary


class _Exact(torch.autograd.Function):
    """Forward: the engine's kernel; backward: the gradient of the plain torch formula of the same op."""

    @staticmethod
    def forward(ctx, fast, ref, *tensors):
        ctx.ref = ref
        ctx.save_for_backward(*tensors)
        return fast(*tensors)

    @staticmethod
    def backward(ctx, grad):
        args = [t.detach().requires_grad_(need) for t, need in zip(ctx.saved_tensors, ctx.needs_input_grad[2:])]
        wanted = [a for a in args if a.requires_grad]
        with torch.enable_grad():
            grads = iter(torch.autograd.grad(ctx.ref(*args), wanted, grad) if wanted else ())
        return (None, None, *[next(grads) if a.requires_grad else None for a in args])


def _gpu(name, ref, *tensors, **options):
    """The engine's Triton kernel `name` on tensors (and options), differentiable through `ref`."""
    from tinyengine import triton_ops  # imported on first GPU use only

    kernel = getattr(triton_ops, name)
    return _Exact.apply(lambda *t: kernel(*t, **options), ref, *tensors)


def softmax(x):
    if not x.is_cuda:
        return torch.softmax(x, dim=-1)
    return _gpu("softmax", lambda t: torch.softmax(t, -1), x)


def log_softmax(x):
    if not x.is_cuda:
        return torch.log_softmax(x, dim=-1)
    return _gpu("log_softmax", lambda t: torch.log_softmax(t, -1), x)


def linear(x, w):
    """[..., din] x [din, dout]: every output is an elementwise product and a sum over din,
    over fixed-size row chunks (bounded temporaries; a row's result never depends on its chunk)."""
    if x.is_cuda:
        return _gpu("linear", torch.matmul, x, w)
    if os.environ.get("TINYCORE_FAST_LINEAR") == "1":  # the trainer's switch: one GEMM, not the engine's order
        return torch.matmul(x, w)
    rows = x.reshape(-1, x.shape[-1])
    out = torch.cat([(r.unsqueeze(-1) * w).sum(-2) for r in rows.split(max(1, CHUNK // w.numel()))])
    return out.view(*x.shape[:-1], w.shape[1])


def rms_norm(x, w, eps):
    if x.is_cuda:
        return _gpu("rms_norm", lambda a, b: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps) * b, x, w, eps=eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def attend(q, k, v, scale):
    """q, k, v: [B, H, T, hd], causal -> [B, H, T, hd]; keys padded to max_seq_len slots like the engine's cache."""
    T, S = q.shape[2], k.shape[2]
    if q.is_cuda:
        scores = _gpu("scores", lambda a, b: a @ b.transpose(-1, -2), q, k) * scale
    else:
        scores = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * scale  # [B, H, T, S]
    future = torch.arange(S, device=q.device) > torch.arange(T, device=q.device)[:, None]
    probs = softmax(scores.masked_fill(future, float("-inf")))
    if q.is_cuda:
        return _gpu("mix", torch.matmul, probs, v)
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
