"""The demo base's recipe with a C++ toolchain that can build vLLM's CPU target.

usage: python benchmarks/real_vllm_base.py     (prints the digest ref; builds once per recipe)

vLLM 0.33.0's CPU target cannot build on the demo base (Debian 12): the base has gcc but no g++,
and cmake/cpu_extension.cmake stops with "X86 backend requires gcc/g++ >= 12.3" (Debian 12 ships
12.2, Debian 13 has no Python 3.11 for the base's cp311 CPU torch); it also links libnuma. A vendor
base (NGC) has all of them. This is demo/baseimage.py with another rootfs: Ubuntu 22.04 (jammy +
jammy-updates: python3.11, g++-12 12.3.0, libnuma-dev), CC/CXX set to gcc-12/g++-12, and its own
repository. The venv is the demo base's (torch 2.13.0+cpu) plus pip 23.0.1, the demo base's pip (jammy's
Python 3.11.0rc1 brings pip 22.2, without `install --dry-run`). Its wheel lock differs from the demo
base's, so it runs with its own BUILDER_CACHE (the lock file sits at a fixed place in the cache).
The Ubuntu archive key comes from ubuntu-keyring in the same archive (the host has none).

Known defect (first real run, 2026-12-01): jammy's python3.11 is 3.11.0rc1, which lacks
sys.get_int_max_str_digits; torch 2.13's torch._dynamo needs it at import, so `import megatron.core`
and `import vllm` fail in this base (vLLM's CPU build itself completes). It needs a base whose
Python is 3.11.0 final or later with g++ >= 12.3 (NGC-like); none is reachable from here.
"""
from __future__ import annotations

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
DEBOOTSTRAP = {
    "suite": "jammy",
    "variant": "minbase",
    "arch": "amd64",
    "components": ["main", "universe"],
    "include": ["libc6-dev", "libnuma-dev"],
    # then `apt-get install` in the rootfs from jammy + jammy-updates (debootstrap --extra-suites fails here)
    "sources": "deb {mirror} jammy main universe\ndeb {mirror} jammy-updates main universe\n",
    "apt_install": ["python3.11", "python3.11-venv", "python3.11-dev", "gcc-12", "g++-12"],
}


def _keyring(work: Path) -> Path:
    out = work / "ubuntu-archive-keyring.gpg"
    if not out.exists():
        deb = work / "ubuntu-keyring.deb"
        subprocess.run(["curl", "-sSf", "-o", str(deb), f"{UBUNTU}/{KEYRING_DEB}"], check=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "keyring")], check=True)
        shutil.copyfile(work / "keyring/usr/share/keyrings/ubuntu-archive-keyring.gpg", out)
    return out


def rootfs_image(settings: Settings, client: Any, work: Path) -> str:
    """demo.baseimage._rootfs_image for the jammy rootfs (extra suite, keyring, mirror)."""
    rhash = baseimage._hash(baseimage._rootfs_recipe())
    tag = f"{baseimage.ROOTFS_REPOSITORY}:{rhash[:16]}"
    if client.images.list(filters={"label": f"{baseimage.ROOTFS_LABEL}={rhash}", "reference": tag}):
        log.info(f"rootfs: reused {tag}")
        return tag
    logfile = settings.cache("logs") / "debootstrap-jammy.log"
    rootfs = work / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    d = DEBOOTSTRAP
    with log.step("base: debootstrap"):
        commands.run_logged(["debootstrap", f"--variant={d['variant']}", f"--arch={d['arch']}",
                             f"--keyring={_keyring(work)}",
                             f"--components={','.join(d['components'])}", f"--include={','.join(d['include'])}",
                             d["suite"], str(rootfs), UBUNTU], logfile, "debootstrap", BuildFailed)
    with log.step("base: apt-get install (jammy-updates)"):
        (rootfs / "etc/apt/sources.list").write_text(str(d["sources"]).format(mirror=UBUNTU))
        shutil.copyfile("/etc/resolv.conf", rootfs / "etc/resolv.conf")
        apt = ["chroot", str(rootfs), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q"]
        commands.run_logged([*apt, "update"], logfile, "apt-get update", BuildFailed)
        commands.run_logged([*apt, "install", "-y", "--no-install-recommends", *d["apt_install"]], logfile,
                            "apt-get install", BuildFailed)
    tar_path = work / "rootfs.tar"
    with log.step("base: normalise + import rootfs"):
        baseimage._normalise(rootfs)
        commands.run_logged(["tar", "--sort=name", "--numeric-owner", "--mtime=@0", "--clamp-mtime",
                             "-C", str(rootfs), "-cf", str(tar_path), "."], logfile, "tar rootfs", BuildFailed)
        shutil.rmtree(rootfs)
        changes = [f"LABEL {baseimage.ROOTFS_LABEL}={rhash}", "ENV LANG=C.UTF-8",
                   "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["/bin/bash"]']
        client.api.import_image_from_file(str(tar_path), repository=baseimage.ROOTFS_REPOSITORY, tag=rhash[:16],
                                          changes=changes)
        tar_path.unlink()
    if not client.images.list(filters={"reference": tag}):
        raise BuildFailed(f"docker import of the jammy rootfs: no image {tag}; see {logfile}")
    return tag


def configure() -> None:
    """Point demo.baseimage at this rootfs, Dockerfile and repository (same wheel lock)."""
    baseimage.DEBOOTSTRAP = DEBOOTSTRAP
    baseimage.BASE_REQUIREMENTS = [*baseimage.BASE_REQUIREMENTS, "pip==23.0.1"]
    baseimage.DOCKERFILE = Path(__file__).with_suffix(".Dockerfile")
    baseimage.REPOSITORY = f"{infra.registry_url()}/real/vllm-cpu-base"
    baseimage._rootfs_image = rootfs_image


def ensure(settings: Settings) -> str:
    configure()
    return baseimage.ensure_base_image(settings)


if __name__ == "__main__":
    cache = Path(os.environ.get("BUILDER_CACHE", ROOT / ".cache")) / "real-vllm-base"
    print(ensure(Settings.from_env({**os.environ, "BUILDER_CACHE": str(cache)})))
