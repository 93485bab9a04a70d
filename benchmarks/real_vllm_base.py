"""The demo base's recipe with a C++ toolchain that can build vLLM's CPU target.

usage: python benchmarks/real_vllm_base.py     (prints the digest ref; builds once per recipe)

vLLM 0.33.0's CPU target cannot build on the demo base (Debian 12): the base has gcc but no g++,
and cmake/cpu_extension.cmake stops with "X86 backend requires gcc/g++ >= 12.3" (Debian 12 ships
12.2, Debian 13 has no Python 3.11 for the base's cp311 CPU torch); it also links libnuma. A vendor
base (NGC) has all of them. This is demo/baseimage.py with another rootfs: Ubuntu 22.04 (jammy +
jammy-updates: g++-12 12.3.0, libnuma-dev), CC/CXX set to gcc-12/g++-12, and its own
repository. The venv is the demo base's (torch 2.13.0+cpu) plus pip 23.0.1, the demo base's pip.
Its wheel lock differs from the demo base's, so it runs with its own BUILDER_CACHE (the lock file sits
at a fixed place in the cache).
The Ubuntu archive key comes from ubuntu-keyring in the same archive (the host has none).

Python: jammy's own python3.11 is 3.11.0rc1, which lacks sys.get_int_max_str_digits; torch 2.13's
torch._dynamo needs it at import (first real run, 2026-12-01: vLLM compiled, then `import megatron.core`
and `import vllm` failed). So the rootfs gets CPython 3.11.2, built from Debian bookworm's orig tarball
(the upstream release tarball; sha256 from bookworm's Sources index) with --prefix=/usr, where jammy's
python3.11 would have put it: same paths for the headers and the interpreter.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.core import commands, log  # noqa: E402
from builder.core.errors import BuildFailed  # noqa: E402
from builder.core.options import Settings  # noqa: E402
from builder.engine import infra  # noqa: E402
from demo import baseimage  # noqa: E402

UBUNTU = "http://archive.ubuntu.com/ubuntu"
KEYRING_DEB = "pool/main/u/ubuntu-keyring/ubuntu-keyring_2021.03.26_all.deb"
DEBOOTSTRAP: dict[str, Any] = {
    "suite": "jammy",
    "variant": "minbase",
    "arch": "amd64",
    "components": ["main", "universe"],
    "include": ["libc6-dev", "libnuma-dev"],
    # then `apt-get install` in the rootfs from jammy + jammy-updates (debootstrap --extra-suites fails here)
    "sources": "deb {mirror} jammy main universe\ndeb {mirror} jammy-updates main universe\n",
    "apt_install": ["gcc-12", "g++-12", "make", "xz-utils", "libssl-dev", "zlib1g-dev", "libffi-dev", "libbz2-dev",
                    "liblzma-dev", "libsqlite3-dev", "uuid-dev"],
    "python_source": {  # CPython 3.11.2 (final) from Debian bookworm's source pool, built in the rootfs
        "url": "http://deb.debian.org/debian/pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz",
        "sha256": "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849",
        "configure": ["--prefix=/usr", "--with-ensurepip=install"],
        "env": {"CC": "gcc-12", "CXX": "g++-12"},
        "pip_wheel_to": "/usr/share/python-wheels",  # where the base recipe's venv step finds pip (Debian's place)
    },
}


def _keyring(work: Path) -> Path:
    out = work / "ubuntu-archive-keyring.gpg"
    if not out.exists():
        deb = work / "ubuntu-keyring.deb"
        subprocess.run(["curl", "-sSf", "-o", str(deb), f"{UBUNTU}/{KEYRING_DEB}"], check=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "keyring")], check=True)
        shutil.copyfile(work / "keyring/usr/share/keyrings/ubuntu-archive-keyring.gpg", out)
    return out


def _python_from_source(rootfs: Path, work: Path, logfile: Path, every: float) -> None:
    """Download (sha256 checked), configure, make and `make altinstall` CPython in the rootfs."""
    src = DEBOOTSTRAP["python_source"]
    tarball = work / Path(src["url"]).name
    if not tarball.exists() or hashlib.sha256(tarball.read_bytes()).hexdigest() != src["sha256"]:
        subprocess.run(["curl", "-sSf", "-o", str(tarball), src["url"]], check=True)
    got = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if got != src["sha256"]:
        raise BuildFailed(f"{src['url']}: sha256 {got}, expected {src['sha256']}")
    build = rootfs / "tmp/python-src"
    build.mkdir(parents=True)
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(build), "--strip-components=1"], check=True)
    env = " ".join(f"{k}={v}" for k, v in src["env"].items())
    script = (f"cd /tmp/python-src && env {env} ./configure {' '.join(src['configure'])}"
              f" && make -j{os.cpu_count() or 2} && make altinstall"
              " && /usr/bin/python3.11 -c 'import sys, ssl, sqlite3, lzma, bz2, ctypes; sys.get_int_max_str_digits()'")
    commands.run_logged(["chroot", str(rootfs), "sh", "-c", script], logfile, "CPython build", BuildFailed,
                        every=every)
    shutil.rmtree(build)
    wheels = rootfs / src["pip_wheel_to"].lstrip("/")
    wheels.mkdir(parents=True, exist_ok=True)
    for wheel in (rootfs / "usr/lib/python3.11/ensurepip/_bundled").glob("pip-*.whl"):
        shutil.copyfile(wheel, wheels / wheel.name)


def _jammy_extras(rootfs: Path, logfile: Path, every: float) -> None:
    """After debootstrap: the jammy-updates packages, then CPython from source (its output in the log, a
    progress line on the console at most every `every` seconds)."""
    d = DEBOOTSTRAP
    with log.step("base: apt-get install (jammy-updates)"):
        (rootfs / "etc/apt/sources.list").write_text(str(d["sources"]).format(mirror=UBUNTU))
        shutil.copyfile("/etc/resolv.conf", rootfs / "etc/resolv.conf")
        apt = ["chroot", str(rootfs), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q"]
        commands.run_logged([*apt, "update"], logfile, "apt-get update", BuildFailed, every=every)
        commands.run_logged([*apt, "install", "-y", "--no-install-recommends", *d["apt_install"]], logfile,
                            "apt-get install", BuildFailed, every=every)
    with log.step("base: CPython 3.11.2 from source"):
        _python_from_source(rootfs, rootfs.parent, logfile, every)


_DEMO_ROOTFS = baseimage._rootfs_image  # the demo's, before configure() points the recipe at the jammy one


def configure(every: float = log.EVERY_S) -> None:
    """Point demo.baseimage at this rootfs, Dockerfile and repository (same wheel lock)."""
    baseimage.DEBOOTSTRAP = DEBOOTSTRAP
    baseimage.BASE_REQUIREMENTS = [*baseimage.BASE_REQUIREMENTS, "pip==23.0.1"]
    baseimage.INSTALL = baseimage.INSTALL.replace("python3 -m venv", "python3.11 -m venv")
    baseimage.CONFIG = [baseimage.CONFIG[0] + ' CC="gcc-12" CXX="g++-12"', *baseimage.CONFIG[1:]]
    baseimage.REPOSITORY = f"{infra.registry_url()}/real/vllm-cpu-base"
    baseimage._rootfs_image = functools.partial(  # the demo's debootstrap + normalise + import, on jammy
        _DEMO_ROOTFS, mirror=UBUNTU, extra_args=lambda work: [f"--keyring={_keyring(work)}"],
        after=functools.partial(_jammy_extras, every=every), log_name="debootstrap-jammy")


def ensure(settings: Settings) -> str:
    configure(settings.progress_every_s)
    return baseimage.ensure_base_image(settings)


if __name__ == "__main__":
    cache = Path(os.environ.get("BUILDER_CACHE", ROOT / ".cache")) / "real-vllm-base"
    print(ensure(Settings.from_env({**os.environ, "BUILDER_CACHE": str(cache)})))
