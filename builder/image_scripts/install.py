"""Install one component into its own prefix, then stamp it (stamp.py), in one build step.

usage: install.py PROVENANCE_JSON PREFIX DISTRIBUTION -- PIP_INSTALL_ARGS...
pip runs as `python -m pip install --prefix PREFIX PIP_INSTALL_ARGS...` with this interpreter.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stamp  # noqa: E402


def main(argv):
    split = argv.index("--")
    provenance, prefix, distribution = argv[:split]
    pip = [sys.executable, "-m", "pip", "install", "--prefix", prefix, *argv[split + 1:]]
    print("+", " ".join(pip), flush=True)
    rc = subprocess.call(pip)
    if rc != 0:
        raise SystemExit(f"pip install of {distribution} failed with exit code {rc}")
    stamp.main(["--prefix", prefix, "--distribution", distribution, provenance])


if __name__ == "__main__":
    main(sys.argv[1:])
