"""In a network-none container of the base (python -B -c SCRIPT MODE): the build requirements from the
wheelhouse at /tmp/lock/wheels installed into /tmp/lock/bt (importable through PYTHONPATH), then

    metadata  a component's metadata from `pip install --dry-run --report` of /tmp/lock/src, printed as JSON
              after the marker line (name, version, requires_dist)
    sdist     a wheel of the one sdist in /tmp/lock/sdist, written to /tmp/lock/out

Stdlib only: it runs with the base's interpreter."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

WORK = "/tmp/lock"


def build_requirements() -> dict[str, str]:
    """Install the build requirements; the environment that makes them importable."""
    wheels = sorted(glob.glob(WORK + "/wheels/*.whl"))
    if wheels:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--disable-pip-version-check", "--target", WORK + "/bt", *wheels], stdout=sys.stderr)
    return dict(os.environ, PYTHONPATH=WORK + "/bt", PIP_DISABLE_PIP_VERSION_CHECK="1")


def metadata(env: dict[str, str]) -> None:
    extra = ["--ignore-requires-python"] if os.environ.get("LOCK_IGNORE_REQUIRES_PYTHON") else []
    rc = subprocess.call([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
                          "--no-index", "--ignore-installed", *extra, "--report", WORK + "/report.json", WORK + "/src"],
                         env=env, stdout=sys.stderr)
    if rc:
        raise SystemExit(rc)
    with open(WORK + "/report.json") as fh:
        meta = json.load(fh)["install"][0]["metadata"]
    print("@@builder-lock-result@@")
    print(json.dumps({"name": meta["name"], "version": meta["version"],
                      "requires_dist": meta.get("requires_dist", [])}))


def sdist(env: dict[str, str]) -> None:
    found = glob.glob(WORK + "/sdist/*")[0]
    raise SystemExit(subprocess.call([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                                      "--no-index", "-w", WORK + "/out", found], env=env, stdout=sys.stderr))


if __name__ == "__main__":
    {"metadata": metadata, "sdist": sdist}[sys.argv[1]](build_requirements())
