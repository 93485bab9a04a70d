from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 32
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    d_ff: int = 256
    max_seq_len: int = 64
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def param_shapes(self) -> dict:
        """Parameter names and shapes; linear weights are [in, out] (y = x @ W)."""
        d, f, v = self.d_model, self.d_ff, self.vocab_size
        shapes = {"tok_emb.weight": (v, d), "pos_emb.weight": (self.max_seq_len, d)}
        for i in range(self.n_layers):
            p = f"layers.{i}."
            shapes.update({
                p + "attn_norm.weight": (d,), p + "attn.wq": (d, d), p + "attn.wk": (d, d),
                p + "attn.wv": (d, d), p + "attn.wo": (d, d), p + "mlp_norm.weight": (d,),
                p + "mlp.w_in": (d, f), p + "mlp.w_out": (f, d),
            })
        shapes.update({"norm.weight": (d,), "lm_head.weight": (d, v)})
        return shapes
