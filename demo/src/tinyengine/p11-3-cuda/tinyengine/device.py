"""Where the engine runs: DEMO_DEVICE when set, else the first GPU when torch sees one, else the CPU."""
import os

import torch

ENV = "DEMO_DEVICE"


def default(environ=None) -> torch.device:
    name = (os.environ if environ is None else environ).get(ENV, "").strip()
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
