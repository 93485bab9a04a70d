"""The model: batched full-sequence forward (teacher forcing) with autograd."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from tinycore.config import ModelConfig


class _Params(nn.Module):
    def __init__(self, **shapes):
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.empty(shape)))


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class TinyCore(nn.Module):
    def __init__(self, config: ModelConfig | None = None, seed: int = 0):
        super().__init__()
        c = self.config = config or ModelConfig()
        d, f, v = c.d_model, c.d_ff, c.vocab_size
        self.tok_emb = _Params(weight=(v, d))
        self.pos_emb = _Params(weight=(c.max_seq_len, d))
        self.layers = nn.ModuleList(
            nn.ModuleDict({
                "attn_norm": _Params(weight=(d,)),
                "attn": _Params(wq=(d, d), wk=(d, d), wv=(d, d), wo=(d, d)),
                "mlp_norm": _Params(weight=(d,)),
                "mlp": _Params(w_in=(d, f), w_out=(f, d)),
            })
            for _ in range(c.n_layers)
        )
        self.norm = _Params(weight=(d,))
        self.lm_head = _Params(weight=(d, v))
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        for name, p in sorted(self.named_parameters()):
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 if "emb" in name else p.shape[0] ** -0.5))

    def forward(self, tokens):
        """tokens [B, T] -> logits [B, T, V]."""
        c = self.config
        B, T = tokens.shape
        x = self.tok_emb.weight[tokens] + self.pos_emb.weight[:T]
        for layer in self.layers:
            a, m = layer["attn"], layer["mlp"]
            h = rms_norm(x, layer["attn_norm"].weight, c.eps)
            q, k, v = ((h @ w).view(B, T, c.n_heads, c.head_dim).transpose(1, 2) for w in (a.wq, a.wk, a.wv))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + att.transpose(1, 2).reshape(B, T, c.d_model) @ a.wo
            h = rms_norm(x, layer["mlp_norm"].weight, c.eps)
            x = x + F.gelu(h @ m.w_in) @ m.w_out
        return rms_norm(x, self.norm.weight, c.eps) @ self.lm_head.weight

    def token_logprobs(self, tokens, aligned: bool = False):
        """Logprob of tokens[:, t+1] given tokens[:, :t+1] -> [B, T-1].

        aligned=True runs the fixed-reduction-order kernels of tinycore.aligned, bitwise
        equal to the rollout engine with DEMO_BATCH_INVARIANT=1 (slower than SDPA/GEMM)."""
        if aligned:
            from tinycore import aligned as _aligned

            return _aligned.sequence_logprobs(dict(self.named_parameters()), self.config, tokens)
        logits = self(tokens)[:, :-1]
        return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
