"""Engine-side weight storage and weight sync from a trainer."""
import struct

import torch

from tinyengine.config import ModelConfig


class Weights:
    def __init__(self, config: ModelConfig, device=None):
        self.config = config
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.params = {n: torch.zeros(s, device=self.device) for n, s in config.param_shapes().items()}
        self.version = 0

    def load(self, named_tensors) -> int:
        """Copy weights in (a state_dict or (name, tensor) pairs); returns how many were loaded."""
        items = named_tensors.items() if hasattr(named_tensors, "items") else named_tensors
        loaded = 0
        for name, tensor in items:
            if name not in self.params:
                raise KeyError(f"unexpected weight {name!r}")
            if tuple(tensor.shape) != tuple(self.params[name].shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != {tuple(self.params[name].shape)}")
            self.params[name] = tensor.detach().to(self.device, torch.float32).clone().contiguous()
            loaded += 1
        self.version += 1
        return loaded

    def fingerprint(self) -> str:
        """Native FNV-1a over all weights in sorted-name order (cheap check that a sync landed)."""
        from tinyengine import _C

        blob = b"".join(
            struct.pack(f"<{t.numel()}f", *t.flatten().tolist()) for _, t in sorted(self.params.items())
        )
        return _C.fnv1a64(blob)
