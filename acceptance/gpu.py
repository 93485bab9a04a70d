"""GPU facts for the run manifest: devices, driver, CUDA runtime, compute capability and the torch settings
that change numerics; the string 'none' when no GPU is visible (stdlib; torch only when installed)."""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from typing import Any

NUMERIC_ENV = ("CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
               "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")

VERSION = re.compile(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)(?:\s|$)")


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version: /proc/driver/nvidia/version, else nvidia-smi."""
    try:
        with open("/proc/driver/nvidia/version") as fh:
            found = VERSION.search(fh.readline())  # "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04 ..."
        if found:
            return found.group(1)
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30, check=False).stdout.split()
            return out[0] if out else None
        except (OSError, subprocess.SubprocessError):
            return None
    return None


def facts() -> dict[str, Any] | str:
    """{'count', 'devices', 'driver', 'cuda_runtime', 'torch', 'numerics'} of the visible GPUs, else 'none'."""
    if importlib.util.find_spec("torch") is None:
        return "none"
    if "torch" not in sys.modules and not glob.glob("/dev/nvidia[0-9]*") and not os.path.exists("/dev/kfd"):
        return "none"  # no GPU device node, and nothing imported torch: not worth its 2 s import to learn that
    import torch  # lazy: only where torch is installed (the image's; the components import it anyway)

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "none"
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append({"index": index, "name": props.name, "compute_capability": f"{props.major}.{props.minor}",
                        "memory_bytes": props.total_memory, "multiprocessors": props.multi_processor_count})
    matmul = torch.backends.cuda.matmul
    numerics = {
        "tf32_matmul": bool(matmul.allow_tf32), "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "fp16_reduced_precision_reduction": bool(matmul.allow_fp16_reduced_precision_reduction),
        "bf16_reduced_precision_reduction": bool(matmul.allow_bf16_reduced_precision_reduction),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "deterministic_warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "env": {k: os.environ.get(k, "unset") for k in NUMERIC_ENV},
    }
    return {"count": len(devices), "devices": devices, "driver": driver_version() or "unknown",
            "cuda_runtime": torch.version.cuda or "unknown", "cudnn": torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
            "torch": torch.__version__, "numerics": numerics}
