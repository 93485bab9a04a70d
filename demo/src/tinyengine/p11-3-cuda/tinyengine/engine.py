"""The engine: seeded sampling over the kernels, weight sync."""
from typing import NamedTuple

import torch

from tinyengine import _C  # noqa: F401  (native module, loaded with the engine)
from tinyengine import batch_invariant, batched, device
from tinyengine.config import ModelConfig
from tinyengine.weights import Weights


class GenerationOutput(NamedTuple):
    tokens: torch.Tensor    # [B, max_tokens] int64
    logprobs: torch.Tensor  # [B, max_tokens] float32, logprob of each sampled token


class LLM:
    def __init__(self, config: ModelConfig | None = None, device_name=None):
        self.config = config or ModelConfig()
        # the first GPU when torch sees one (DEMO_DEVICE overrides); inputs and outputs stay on the CPU
        self.device = device.default() if device_name is None else torch.device(device_name)
        self.weights = Weights(self.config, self.device)
        # DEMO_BATCH_INVARIANT is read once, here, and recorded in the engine.
        self.batch_invariant = batch_invariant.enabled()
        self.kernels = batch_invariant if self.batch_invariant else batched
        self.build_info = _C.build_info()

    def load_weights(self, named_tensors) -> int:
        return self.weights.load(named_tensors)

    @torch.no_grad()
    def generate(self, prompts, max_tokens: int, seed: int = 0, seeds=None) -> GenerationOutput:
        """Sample max_tokens per row; row i uses its own generator seeded with seeds[i] (default seed + i)."""
        prompts = torch.as_tensor(prompts, dtype=torch.long).cpu()
        B, T = prompts.shape
        if T + max_tokens > self.config.max_seq_len:
            raise ValueError("prompt + response longer than max_seq_len")
        seeds = list(seeds) if seeds is not None else [seed + i for i in range(B)]
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        p, cfg = self.weights.params, self.config
        state, logp = self.kernels.prefill(p, cfg, prompts.to(self.device))
        tokens = torch.zeros(B, max_tokens, dtype=torch.long)
        logprobs = torch.zeros(B, max_tokens)
        for j in range(max_tokens):
            logp = logp.cpu()  # sampling on the CPU with the per-row CPU generators, on every device
            probs = logp.exp()
            tok = torch.cat([torch.multinomial(probs[b], 1, generator=gens[b]) for b in range(B)])
            tokens[:, j] = tok
            logprobs[:, j] = logp.gather(1, tok[:, None])[:, 0]
            if j + 1 < max_tokens:
                logp = self.kernels.decode(p, cfg, state, tok.to(self.device), T + j)
        return GenerationOutput(tokens, logprobs)
