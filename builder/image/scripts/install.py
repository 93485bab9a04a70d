"""Install one component into its own prefix, then stamp it (stamp.py), in one build step.

usage: install.py PROVENANCE_JSON PREFIX DISTRIBUTION [EARLIER_PREFIX ...] -- PIP_INSTALL_ARGS...
Earlier components' prefixes go on PYTHONPATH (site dirs from sysconfig, so Debian's
local/dist-packages layout works too). pip gets `-c` with the base pins of constraints.txt plus
the versions of any constrained distribution an earlier component installed (e.g. vllm for verl).
"""
import os
import re
import subprocess
import sys
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stamp  # noqa: E402
from common import norm, site_dirs  # noqa: E402

NAMES = "/builder/constraints.in"
# an offline CMake build asked for a source the lock does not name (native_provider.cmake, or FetchContent's own check)
UNDECLARED = [re.compile(r"builder: native input '([^']+)' is not in the lock"),
              re.compile(r"requires the source\s+directory for dependency (\S+) to already be populated")]
BASE_PINS = "/builder/constraints.txt"


def constraints(earlier_dirs, out, names_file=NAMES, base_pins=BASE_PINS):
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


def run(argv, env):
    """(exit code, first undeclared native input named in the output or ''), the output streamed as it comes."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    found = ""
    for line in proc.stdout:
        sys.stdout.write(line)
        for rx in UNDECLARED:
            match = rx.search(line)
            if match and not found:
                found = match.group(1)
    sys.stdout.flush()
    return proc.wait(), found


def main(argv):
    split = argv.index("--")
    provenance, prefix, distribution, *earlier = argv[:split]
    earlier_dirs = [d for p in earlier for d in site_dirs(p)]
    env = dict(os.environ)
    if earlier_dirs:
        env["PYTHONPATH"] = os.pathsep.join(earlier_dirs)
    bins = [os.path.join(p, "bin") for p in earlier if os.path.isdir(os.path.join(p, "bin"))]
    if bins:  # build tools' commands (cmake, ninja from the build-tools prefix)
        env["PATH"] = os.pathsep.join(bins + [env.get("PATH", os.defpath)])
    pins = constraints(earlier_dirs, f"/tmp/constraints-{distribution}.txt")
    pip = [sys.executable, "-m", "pip", "install", "--prefix", prefix, "-c", pins, *argv[split + 1:]]
    print("+", " ".join(pip), flush=True)
    rc, undeclared = run(pip, env)
    if undeclared:
        raise SystemExit(f"builder: {distribution}: native input '{undeclared}' is not in the lock; the build is offline"
                         " (FETCHCONTENT_FULLY_DISCONNECTED=ON): declare it where `builder lock` reads it")
    if rc != 0:
        raise SystemExit(f"pip install of {distribution} failed with exit code {rc}")
    stamp.main(["--prefix", prefix, "--distribution", distribution, provenance])


if __name__ == "__main__":
    main(sys.argv[1:])
