"""Real vLLM for the real-repos check: a git repository made from a vLLM release sdist on pip's index.

usage: python benchmarks/real_vllm.py --mirrors DIR [--version X.Y.Z] [--work DIR]

Writes DIR/vllm-<version>.git: the sdist's files as one commit tagged `v<version>` on refs/heads/main, plus one
Python-only commit on top as the PR (refs/pull/1/head). Fixed author and dates, so the commits are
the same on every machine for the same sdist. Only pip talks to the index, the one pip is configured with
(PIP_INDEX_URL, pip.conf; a mirror or an internal index works): `pip index versions vllm` gives the newest
version, `pip download --no-deps --no-binary :all: vllm==X` the sdist (and its hash check). pip prepares
metadata on the way; vLLM's setup.py needs setuptools-rust and setuptools-scm for that, and torch (its
build requirement, GBs) is not wanted: so pip runs without build isolation in a throwaway venv that sees
this interpreter's packages (torch) and gets the two build tools from the same index; VLLM_TARGET_DEVICE=empty
keeps setup.py from looking for a toolchain.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PR_NUMBER = 1
# sdist-only files that are not in vLLM's git tree
SDIST_ONLY = ("PKG-INFO", "vllm.egg-info")
IDENTITY = {"GIT_AUTHOR_NAME": "real-repos", "GIT_AUTHOR_EMAIL": "real-repos@localhost",
            "GIT_COMMITTER_NAME": "real-repos", "GIT_COMMITTER_EMAIL": "real-repos@localhost"}
# The PR: a Python-only change (a default of the batch-invariance switch's docs), no build file touched.
PR_FILE = "vllm/envs.py"
PR_NOTE = "# real-repos PR: Python-only change on top of the release (no build file touched)\n"
METADATA_TOOLS = ("setuptools-rust", "setuptools-scm>=8")  # what vLLM's setup.py imports to give its metadata
PIP = ("-m", "pip", "--disable-pip-version-check")


def say(message: str) -> None:
    print(message, flush=True)


def _pip(python: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, *PIP, *args], capture_output=True, text=True, check=False, env=env)


def _why(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return next((line.strip() for line in lines if "rror" in line), lines[-1] if lines else "?")


def newest_version() -> str:
    """The newest vllm on pip's configured index (`pip index versions`)."""
    proc = _pip(sys.executable, "index", "versions", "vllm")
    found = re.search(r"^vllm \(([^)\s]+)\)", proc.stdout, re.M)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"pip index versions vllm: {_why(proc)}; pass --version (make real-repos VLLM_VERSION=...)")
    return found.group(1)


def download_sdist(version: str, dest: Path) -> Path:
    """The sdist of vllm==version in dest, by `pip download` from pip's configured index."""
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"vllm-{version}.tar.gz"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(prefix="real-vllm-pip-") as tmp:
        venv = Path(tmp) / "venv"  # sees this interpreter's packages (torch), gets only the metadata tools
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        tools = _pip(python, "install", "-q", *METADATA_TOOLS)
        if tools.returncode != 0:
            raise SystemExit(f"pip install {' '.join(METADATA_TOOLS)}: {_why(tools)}")
        env = {**os.environ, "VLLM_TARGET_DEVICE": "empty"}
        proc = _pip(python, "download", "--no-deps", "--no-build-isolation", "--no-binary", ":all:",
                    f"vllm=={version}", "-d", str(dest), env=env)
    found = sorted(dest.glob(f"vllm-{version}.tar.gz"))
    if proc.returncode != 0 or not found:
        raise SystemExit(f"pip download vllm=={version} (sdist): {_why(proc)}")
    say(f"sdist       pip download: {found[0].name}")
    return found[0]


def git(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def make_repo(sdist: Path, version: str, bare: Path) -> tuple[str, str]:
    """bare: main = the sdist's tree tagged v<version>; refs/pull/1/head = one Python-only commit on it."""
    if (bare / "HEAD").exists():
        return git("rev-parse", f"refs/tags/v{version}^{{commit}}", cwd=bare), \
            git("rev-parse", f"refs/pull/{PR_NUMBER}/head", cwd=bare)
    with tempfile.TemporaryDirectory(prefix="real-vllm-") as tmp:
        subprocess.run(["tar", "-xzf", str(sdist), "-C", tmp, "--no-same-owner"], check=True)
        tree = Path(tmp) / f"vllm-{version}"
        for name in SDIST_ONLY:
            path = tree / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        env = {**os.environ, **IDENTITY, "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
               "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
        git("init", "-q", "-b", "main", cwd=tree)
        git("add", "-A", "-f", cwd=tree)
        git("commit", "-q", "--no-gpg-sign", "-m", f"vLLM {version} (from {sdist.name})", cwd=tree, env=env)
        git("tag", f"v{version}", cwd=tree)
        target = tree / PR_FILE
        target.write_text(PR_NOTE + target.read_text())
        env.update(GIT_AUTHOR_DATE="2026-01-02T00:00:00Z", GIT_COMMITTER_DATE="2026-01-02T00:00:00Z")
        git("commit", "-q", "--no-gpg-sign", "-am", "PR: Python-only change on top of the release", cwd=tree, env=env)
        git("update-ref", f"refs/pull/{PR_NUMBER}/head", "HEAD", cwd=tree)
        git("checkout", "-q", "--detach", cwd=tree)
        git("update-ref", "refs/heads/main", f"v{version}", cwd=tree)
        subprocess.run(["git", "clone", "-q", "--bare", "--mirror", str(tree), str(bare)], check=True)
    return make_repo(sdist, version, bare)


def repo_name(version: str) -> str:
    return f"vllm-{version}.git"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mirrors", type=Path, required=True)
    ap.add_argument("--version", help="default: the newest on pip's configured index")
    ap.add_argument("--work", type=Path, default=Path(__file__).resolve().parent.parent / ".cache" / "real-repos")
    args = ap.parse_args()
    version = args.version or newest_version()
    sdist = download_sdist(version, args.work / "sdist")
    tag, pr = make_repo(sdist, version, args.mirrors / repo_name(version))
    say(f"vllm.git    v{version} {tag}, PR #{PR_NUMBER} {pr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
