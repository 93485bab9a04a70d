"""Install one component into its own prefix, then stamp it (stamp.py), in one build step.

usage: install.py PROVENANCE_JSON PREFIX DISTRIBUTION [EARLIER_PREFIX ...] -- PIP_INSTALL_ARGS...
Earlier components' prefixes go on PYTHONPATH (site dirs from sysconfig, so Debian's
local/dist-packages layout works too). pip gets `-c` with the base pins of constraints.txt plus
the versions of any constrained distribution an earlier component installed (e.g. vllm for verl).
"""
from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stamp  # noqa: E402
from common import norm, site_dirs  # noqa: E402

NAMES = "/builder/constraints.in"
BASE_PINS = "/builder/constraints.txt"


def constraints(earlier_dirs: list[str], out: str, names_file: str = NAMES, base_pins: str = BASE_PINS) -> str:
    """Base pins plus `name==version` for constrained names found in earlier prefixes."""
    lines = [line for line in open(base_pins).read().splitlines() if line.strip()]
    pinned = {norm(line.split("==")[0]) for line in lines}
    wanted = [n.strip() for n in open(names_file).read().splitlines() if n.strip() and norm(n) not in pinned]
    found = {norm(d.metadata["Name"]): d.version for d in metadata.distributions(path=earlier_dirs)}
    lines += [f"{name}=={found[norm(name)]}" for name in wanted if norm(name) in found]
    with open(out, "w") as fh:
        fh.write("".join(line + "\n" for line in lines))
    print("constraints:", " ".join(lines) or "(none)", flush=True)
    return out


def main(argv: list[str]) -> None:
    split = argv.index("--")
    provenance, prefix, distribution, *earlier = argv[:split]
    earlier_dirs = [d for p in earlier for d in site_dirs(p)]
    env = dict(os.environ)
    if earlier_dirs:
        env["PYTHONPATH"] = os.pathsep.join(earlier_dirs)
    pins = constraints(earlier_dirs, f"/tmp/constraints-{distribution}.txt")
    pip = [sys.executable, "-m", "pip", "install", "--prefix", prefix, "-c", pins, *argv[split + 1:]]
    print("+", " ".join(pip), flush=True)
    rc = subprocess.call(pip, env=env)
    if rc != 0:
        raise SystemExit(f"pip install of {distribution} failed with exit code {rc}")
    stamp.main(["--prefix", prefix, "--distribution", distribution, provenance])


if __name__ == "__main__":
    main(sys.argv[1:])
