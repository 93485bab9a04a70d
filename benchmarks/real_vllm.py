"""Real vLLM for the real-repos check: a git repository made from vLLM's newest release sdist on PyPI.

usage: python benchmarks/real_vllm.py --mirrors DIR [--version X.Y.Z] [--work DIR]

Writes DIR/vllm-<version>.git: the sdist's files as one commit tagged `v<version>` on refs/heads/main, plus one
Python-only commit on top as the PR (refs/pull/1/head). Fixed author and dates, so the commits are
the same on every machine for the same sdist. The sdist comes from `pip download --no-deps
--no-build-isolation --no-binary :all:`; pip prepares metadata on the way, which vLLM's setup.py
cannot do without setuptools-rust, so the fallback is the sdist URL from PyPI's JSON API, checked
against its sha256.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

PYPI_JSON = "https://pypi.org/pypi/vllm/json"
PR_NUMBER = 1
# sdist-only files that are not in vLLM's git tree
SDIST_ONLY = ("PKG-INFO", "vllm.egg-info")
IDENTITY = {"GIT_AUTHOR_NAME": "real-repos", "GIT_AUTHOR_EMAIL": "real-repos@localhost",
            "GIT_COMMITTER_NAME": "real-repos", "GIT_COMMITTER_EMAIL": "real-repos@localhost"}
# The PR: a Python-only change (a default of the batch-invariance switch's docs), no build file touched.
PR_FILE = "vllm/envs.py"
PR_NOTE = "# real-repos PR: Python-only change on top of the release (no build file touched)\n"


def say(message: str) -> None:
    print(message, flush=True)


def newest_version() -> str:
    with urllib.request.urlopen(PYPI_JSON, timeout=60) as resp:
        return str(json.load(resp)["info"]["version"])


def download_sdist(version: str, dest: Path) -> Path:
    """The sdist of vllm==version in dest: pip first, else PyPI's JSON API (sha256 checked)."""
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"vllm-{version}.tar.gz"))
    if found:
        return found[0]
    # --no-build-isolation: pip prepares metadata on the way; isolated, it would first install vLLM's
    # build requirements (torch == X, GBs of CUDA wheels) just to fail or to read the metadata
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "--no-binary",
                           ":all:", f"vllm=={version}", "-d", str(dest)], capture_output=True, text=True, check=False)
    found = sorted(dest.glob(f"vllm-{version}.tar.gz"))
    if proc.returncode == 0 and found:
        say(f"sdist       pip download: {found[0].name}")
        return found[0]
    why = (proc.stdout + proc.stderr).strip().splitlines()
    reason = next((line.strip() for line in why if "Error" in line), why[-1] if why else "?")
    say(f"sdist       pip download failed ({reason}); using PyPI's JSON API")
    with urllib.request.urlopen(PYPI_JSON, timeout=60) as resp:
        releases = json.load(resp)["releases"].get(version, [])
    sdist = next((u for u in releases if u["packagetype"] == "sdist"), None)
    if sdist is None:
        raise SystemExit(f"vllm {version}: PyPI lists no sdist")
    url = urllib.parse.urljoin(PYPI_JSON, sdist["url"])
    with urllib.request.urlopen(url, timeout=600) as resp:
        data = resp.read()
    if hashlib.sha256(data).hexdigest() != sdist["digests"]["sha256"]:
        raise SystemExit(f"{url}: sha256 does not match PyPI's")
    path: Path = dest / sdist["filename"]
    path.write_bytes(data)
    say(f"sdist       {url} sha256 {sdist['digests']['sha256']}")
    return path


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
    ap.add_argument("--version", help="default: the newest on PyPI")
    ap.add_argument("--work", type=Path, default=Path(__file__).resolve().parent.parent / ".cache" / "real-repos")
    args = ap.parse_args()
    version = args.version or newest_version()
    sdist = download_sdist(version, args.work / "sdist")
    tag, pr = make_repo(sdist, version, args.mirrors / repo_name(version))
    say(f"vllm.git    v{version} {tag}, PR #{PR_NUMBER} {pr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
