"""In a network-none container of the base (python -B -c): what the base provides, printed as JSON after
the marker line: interpreter, ABI, platform, libc, environment markers, installed distributions, and the
RECORD sha256 of its torch/torchvision/torchaudio (the build checks them unchanged). Stdlib only."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import sysconfig
from importlib import metadata

dists: dict[str, str] = {}
records: dict[str, list[str]] = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if name:
        dists.setdefault(name, dist.version)
    if name and name.lower() in ("torch", "torchvision", "torchaudio") and name not in records:
        path = os.path.join(str(dist._path), "RECORD")  # type: ignore[attr-defined]
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                records[name] = [dist.version, os.path.basename(str(dist._path)) + "/RECORD",  # type: ignore[attr-defined]
                                 hashlib.sha256(fh.read()).hexdigest()]
impl = sys.implementation.name
markers = {
    "implementation_name": impl,
    "implementation_version": ".".join(str(n) for n in sys.implementation.version[:3]),
    "os_name": os.name, "platform_machine": platform.machine(),
    "platform_release": platform.release(), "platform_system": platform.system(),
    "platform_version": platform.version(), "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": f"{sys.version_info[0]}.{sys.version_info[1]}", "sys_platform": sys.platform,
}
libc = platform.libc_ver()
print("@@builder-lock-result@@")
print(json.dumps({"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "impl": impl,
                  "soabi": sysconfig.get_config_var("SOABI") or "", "machine": platform.machine(),
                  "libc": [libc[0], libc[1]], "markers": markers, "dists": dists,
                  "records": records}, sort_keys=True))
