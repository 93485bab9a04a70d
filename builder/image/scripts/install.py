"""Install one component into its own prefix, then stamp it (stamp.py), in one build step.

usage: install.py PROVENANCE_JSON PREFIX DISTRIBUTION [EARLIER_PREFIX ...] -- PIP_INSTALL_ARGS...
Earlier components' prefixes go on PYTHONPATH (site dirs from sysconfig, so Debian's
local/dist-packages layout works too). pip gets `-c` with the base pins of constraints.txt plus
the versions of any constrained distribution an earlier component installed (e.g. vllm for verl).
"""
from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import sysconfig
import time
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stamp  # noqa: E402
from common import norm, site_dirs  # noqa: E402

NAMES = "/builder/constraints.in"
# an offline CMake build asked for a source the lock does not name (native_provider.cmake, or FetchContent's own check)
UNDECLARED = [re.compile(r"builder: native input '([^']+)' is not in the lock"),
              re.compile(r"requires the source\s+directory for dependency (\S+) to already be populated")]
BASE_PINS = "/builder/constraints.txt"
CCACHE = "/builder/ccache/bin/ccache"  # seeded by the tool (builder/image/ccache.py); absent: no cache
MASQUERADE = "/tmp/ccache-bin"
COMPILERS = ("cc", "c++", "gcc", "g++", "clang", "clang++")
STATS = {"direct_cache_hit": "direct", "preprocessed_cache_hit": "preprocessed", "cache_miss": "misses",
         "called_for_link": "link", "called_for_preprocessing": "preprocess"}


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


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """(exit code, first undeclared native input named in the output or ''), the output streamed as it comes."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    found = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        for rx in UNDECLARED:
            match = rx.search(line)
            if match and not found:
                found = match.group(1)
    sys.stdout.flush()
    return proc.wait(), found


def compiler_cache(env: dict[str, str], ccache: str = CCACHE, masquerade: str = MASQUERADE) -> bool:
    """Route the C/C++ compilers (and CMake's CUDA launcher) through ccache when the tool seeded it:
    symlinks named like the compilers (sysconfig's CC/CXX too) first on PATH. The outputs are the
    compiler's own bytes, so the image is the same with or without it."""
    if not env.get("CCACHE_DIR") or not os.access(ccache, os.X_OK):
        return False
    names = set(COMPILERS)
    for var in ("CC", "CXX"):
        words = (sysconfig.get_config_var(var) or "").split()
        if words:
            names.add(os.path.basename(words[0]))
    os.makedirs(masquerade, exist_ok=True)
    for name in sorted(names):
        link = os.path.join(masquerade, name)
        if not os.path.lexists(link):
            os.symlink(ccache, link)
    env["PATH"] = masquerade + os.pathsep + env.get("PATH", "")
    env.update(CCACHE_BASEDIR="/builder", CCACHE_COMPILERCHECK="content", CCACHE_MAXSIZE="5G",
               CCACHE_UMASK="022", CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    subprocess.check_call([ccache, "--zero-stats"], env=env, stdout=subprocess.DEVNULL)
    return True


def cache_stats(env: dict[str, str], ccache: str = CCACHE) -> None:
    """ccache's counters for this install, one JSON line the tool reads from the build log."""
    out = subprocess.run([ccache, "--print-stats"], env=env, capture_output=True, text=True, check=True).stdout
    raw = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    counters = {short: int(raw.get(key, 0)) for key, short in STATS.items()}
    counters["hits"] = counters["direct"] + counters["preprocessed"]
    counters["calls"] = counters["hits"] + counters["misses"]
    print("CCACHE-STATS " + json.dumps(counters, sort_keys=True), flush=True)


def main(argv: list[str]) -> None:
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
    cached = compiler_cache(env)
    pip = [sys.executable, "-m", "pip", "install", "--prefix", prefix, "-c", pins, *argv[split + 1:]]
    print("+", " ".join(pip), flush=True)
    start = time.monotonic()
    rc, undeclared = run(pip, env)
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)  # pip and every compiler it ran
    print("INSTALL-TIME " + json.dumps({"wall_s": round(time.monotonic() - start, 3),
                                        "cpu_s": round(cpu.ru_utime + cpu.ru_stime, 3)}), flush=True)
    if undeclared:
        raise SystemExit(f"builder: {distribution}: native input '{undeclared}' is not in the lock; the build is offline"
                         " (FETCHCONTENT_FULLY_DISCONNECTED=ON): declare it where `builder lock` reads it")
    if rc != 0:
        raise SystemExit(f"pip install of {distribution} failed with exit code {rc}")
    if cached:
        cache_stats(env)
    stamp.main(["--prefix", prefix, "--distribution", distribution, provenance])


if __name__ == "__main__":
    main(sys.argv[1:])
