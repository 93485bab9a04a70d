"""Quick checks, one after the other, that the trainer's sys.path imports tinyrl: each a fresh interpreter with -S
-I (no site scan, no environment), so a few milliseconds of work; each names itself probe-<n> in its arguments."""
import subprocess
import sys

CHECK = "import sys; sys.path[:0] = sys.argv[2:]; import tinyrl"
TIMES = 10


def run():
    path = [p for p in sys.path if p]
    for n in range(TIMES):
        subprocess.run([sys.executable, "-S", "-I", "-c", CHECK, f"probe-{n}", *path], check=False)
