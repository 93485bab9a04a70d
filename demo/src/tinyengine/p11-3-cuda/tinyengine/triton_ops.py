"""Batch-invariant GPU kernels in Triton (imported only on CUDA; Triton ships with torch's CUDA wheels).

One configuration per kernel, never chosen from the shapes, so an output's reduction order is fixed:
- matmul: each output element is acc += a[m, k] * b[k, n] over k = 0, 1, ..., K-1 in order, one program per
  32x32 output tile; the tile a row lands in, and how many rows there are, change nothing in its sum.
- rms_norm, softmax / log_softmax: one program per row, the row's sum is one fixed tree over the row
  (set by the row width alone), whatever the number of rows.
fp32 throughout (no TF32, no tensor-core split of K). The trainer's aligned forward calls these same kernels.
"""
import torch
import triton
import triton.language as tl

TILE = 32
WARPS = 4


@triton.jit
def bi_matmul(a, b, c, M, N, K, sab, sam, sak, sbb, sbk, sbn, scb, scm, scn,
              BM: tl.constexpr, BN: tl.constexpr):
    batch = tl.program_id(2)
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mm, mn = rm < M, rn < N
    pa = a + batch * sab + rm * sam
    pb = b + batch * sbb + rn * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K):  # k = 0, 1, ... in order: the reduction order of every output
        x = tl.load(pa + k * sak, mask=mm, other=0.0)
        y = tl.load(pb + k * sbk, mask=mn, other=0.0)
        acc += x[:, None] * y[None, :]
    tl.store(c + batch * scb + rm[:, None] * scm + rn[None, :] * scn, acc, mask=mm[:, None] & mn[None, :])


@triton.jit
def bi_rms_norm(x, w, y, N, eps, BN: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BN)
    m = cols < N
    v = tl.load(x + row * N + cols, mask=m, other=0.0)
    inv = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / N + eps)
    tl.store(y + row * N + cols, v * inv * tl.load(w + cols, mask=m, other=0.0), mask=m)


@triton.jit
def bi_softmax(x, y, N, LOG: tl.constexpr, BN: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BN)
    m = cols < N
    v = tl.load(x + row * N + cols, mask=m, other=-float("inf"))
    shifted = v - tl.max(v, axis=0)  # the max is exact in any order
    e = tl.exp(shifted)
    total = tl.sum(e, axis=0)
    if LOG:
        out = shifted - tl.log(total)
    else:
        out = e / total
    tl.store(y + row * N + cols, out, mask=m)


def bmm(a, b):
    """[Bt, M, K] x [Bt, K, N] -> [Bt, M, N] (any strides), fp32."""
    Bt, M, K = a.shape
    N = b.shape[2]
    c = torch.empty((Bt, M, N), device=a.device, dtype=torch.float32)
    grid = (triton.cdiv(M, TILE), triton.cdiv(N, TILE), Bt)
    bi_matmul[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(), BM=TILE, BN=TILE, num_warps=WARPS)
    return c


def linear(x, w):
    """[..., din] x [din, dout]."""
    rows = x.reshape(1, -1, x.shape[-1])
    return bmm(rows, w.unsqueeze(0))[0].view(*x.shape[:-1], w.shape[1])


def _rows(x):
    return x.reshape(-1, x.shape[-1]).contiguous()


def rms_norm(x, w, eps):
    rows = _rows(x)
    out = torch.empty_like(rows)
    n = rows.shape[1]
    bi_rms_norm[(rows.shape[0],)](rows, w.contiguous(), out, n, eps, BN=triton.next_power_of_2(n), num_warps=WARPS)
    return out.view(x.shape)


def _softmax(x, log):
    rows = _rows(x)
    out = torch.empty_like(rows)
    n = rows.shape[1]
    bi_softmax[(rows.shape[0],)](rows, out, n, LOG=log, BN=triton.next_power_of_2(n), num_warps=WARPS)
    return out.view(x.shape)


def softmax(x):
    return _softmax(x, False)


def log_softmax(x):
    return _softmax(x, True)


def scores(q, k):
    """q [..., T, hd], k [..., S, hd] -> q k^T [..., T, S] (sum over hd in order)."""
    lead = q.shape[:-2]
    a = q.reshape(-1, *q.shape[-2:])
    b = k.reshape(-1, *k.shape[-2:]).transpose(1, 2)
    return bmm(a, b).view(*lead, q.shape[-2], k.shape[-2])


def mix(probs, v):
    """probs [..., T, S], v [..., S, hd] -> [..., T, hd] (sum over all S slots in order)."""
    lead = probs.shape[:-2]
    return bmm(probs.reshape(-1, *probs.shape[-2:]), v.reshape(-1, *v.shape[-2:])).view(
        *lead, probs.shape[-2], v.shape[-1])
