"""The demo base image (stands in for a vendor base such as nvcr.io/nvidia/pytorch).

    debootstrap --variant=minbase bookworm  ->  normalise + `docker import`  (rootfs image)
    -> a network-none container of the rootfs gets the wheelhouse (put_archive into /tmp/base) and
       runs INSTALL: /opt/venv holding CPU torch 2.13.0 + deps + setuptools + wheel, installed offline
       (--no-index --require-hashes), bytecode compiled on every core, the wheelhouse deleted again
    -> `docker commit` with CONFIG (one layer: the venv; the wheels never were in a layer)
    -> push 127.0.0.1:5000/demo/base:<recipe hash[:16]> through the registry API, the layers compressed by pigz
       (demo/basepush.py)  ->  127.0.0.1:5000/demo/base@sha256:...

Wheels are downloaded on the host (`pip download`) into <cache>/wheels/base and pinned in
a lock with our own sha256 of each file.  The recipe hash covers the debootstrap options, INSTALL,
CONFIG and that lock; an image labelled with it that is in the engine AND in the registry
is reused as is.  Run as `python -m demo base`; each step's time is in <cache>/demo/base/<tag>/build.json.

Where the time went before (a 2-core machine, loaded): debootstrap 127 s, `docker build` 298 s
(the 194 MB wheelhouse sent as context and copied into a layer, pip compiling bytecode one file at
a time, then the 1 GB venv copied once more into the final stage), push 198 s.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from builder.core import commands, log
from builder.core import files as fs
from builder.core.errors import BadInput, BuildFailed, InfraError, PublishError
from builder.core.options import Settings
from builder.engine import client as engine
from builder.engine import infra
from builder.engine.registry import Registry
from builder.lock import wheels
from demo import basepush

REPOSITORY = f"{infra.registry_url()}/demo/base"
RECIPE_LABEL = "io.truepolicy.demo.base.recipe"
ROOTFS_LABEL = "io.truepolicy.demo.rootfs.recipe"
ROOTFS_REPOSITORY = "builder-demo/rootfs"  # local only, never pushed

# What goes into the rootfs (part of the recipe).  The mirror is where it comes from, not what it is.
DEBOOTSTRAP: dict[str, Any] = {
    "suite": "bookworm",
    "variant": "minbase",
    "arch": "amd64" if platform.machine() in ("x86_64", "AMD64") else "arm64",
    "components": ["main"],
    "include": ["python3", "python3-venv", "python3-dev", "gcc", "libc6-dev"],
}
# Removed from the rootfs before import (part of the recipe: change it and the image changes).
NORMALISE: dict[str, Any] = {
    "version": 1,
    "remove_contents": ["var/cache/apt/archives", "var/lib/apt/lists", "var/log", "tmp", "var/tmp",
                        "run", "dev", "proc", "sys", "usr/share/man", "usr/share/info", "usr/share/locale"],
    "remove_files": ["var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin", "etc/resolv.conf",
                     "etc/hostname", "var/cache/debconf/templates.dat-old", "var/lib/dpkg/status-old"],
    "keep_in_usr_share_doc": "copyright",
    "empty": ["etc/machine-id"],
    "mtime": 0,
}
# The venv, installed in a network-none container of the rootfs (part of the recipe). The venv gets
# Debian's pip wheel only (ensurepip would also install, then compile, setuptools 66 that the lock
# replaces); pip compiles no bytecode (one file at a time); compileall does it on every core.
INSTALL = """set -eu
mark() { echo "@@phase $1 $(date +%s.%N)"; }
mark venv
python3 -m venv --without-pip /opt/venv
pip_wheel=$(ls /usr/share/python-wheels/pip-*.whl)
/opt/venv/bin/python "$pip_wheel/pip" install --no-cache-dir --disable-pip-version-check --no-compile --no-index \\
    "$pip_wheel"
mark pip-install
/opt/venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check --no-compile \\
    --no-index --require-hashes -r /tmp/base/requirements.lock --find-links /tmp/base/wheels
mark bytecode
/opt/venv/bin/python -m compileall -q -j 0 /opt/venv/lib || echo "compileall: some files did not compile (pip ignores those too)"
mark check
/opt/venv/bin/python -m pip check
/opt/venv/bin/python -c "import torch, setuptools, wheel; print('torch', torch.__version__)"
rm -rf /tmp/base
mark end
"""
# The image config `docker commit` writes (part of the recipe).
CONFIG = ['ENV LANG="C.UTF-8" VIRTUAL_ENV="/opt/venv"'
          ' PATH="/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'
          ' PIP_DISABLE_PIP_VERSION_CHECK="1" PIP_NO_CACHE_DIR="1"',
          'CMD ["/bin/bash"]', 'WORKDIR /']
# Inputs of the wheel lock (the lock pins the full resolved set).
# torch's whole dependency closure, each at one version: the demo lock (pins/locks/demo.lock) records what the
# base provides, so a new release of any of them on the index (filelock 4.3.2 did it) must not change a fresh base
BASE_REQUIREMENTS = ["torch==2.13.0+cpu", "setuptools==84.2.1", "wheel==0.48.0", "filelock==4.3.1",
                     "fsspec==2026.9.0", "jinja2==3.1.6", "markupsafe==3.0.4", "mpmath==1.3.0", "networkx==3.6.1",
                     "packaging==26.4", "sympy==1.14.0", "typing-extensions==4.16.0"]
TARGET_PYTHON = "3.11"
# The linux/arm64 demo base (`make demo-arm64`, demo/arm64.py): torch 2.10.0 is the newest aarch64 wheel that is a CPU
# build; the same closure, downloaded with --no-deps (pip evaluates torch's markers for the host, x86_64, and would
# ask for its nvidia-* wheels)
FOREIGN_REQUIREMENTS = {"arm64": ["torch==2.10.0", *BASE_REQUIREMENTS[1:]]}
HOST_ARCH = str(DEBOOTSTRAP["arch"])
_LATER: list[threading.Thread] = []  # removals running beside the next steps, joined before the base is returned



# --------------------------------------------------------------------------- wheels

TARGET = wheels.Target.from_base(TARGET_PYTHON, f"linux/{DEBOOTSTRAP['arch']}")


def _requirements(arch: str | None) -> tuple[list[str], wheels.Target, list[str]]:
    """(requirements, target, extra pip args) of the base for `arch` (None: this host's)."""
    if arch is None or arch == HOST_ARCH:
        return BASE_REQUIREMENTS, TARGET, []
    if arch not in FOREIGN_REQUIREMENTS:
        raise BadInput(f"demo base: arch expected one of {HOST_ARCH}, {', '.join(FOREIGN_REQUIREMENTS)}, got {arch!r}")
    return FOREIGN_REQUIREMENTS[arch], wheels.Target.from_base(TARGET_PYTHON, f"linux/{arch}"), ["--no-deps"]


def base_lock(settings: Settings, arch: str | None = None) -> tuple[str, dict[str, Path]]:
    """(lock text, {req: wheel path}) for the base venv of `arch` (None: this host's); downloads only when the
    inputs changed or a wheel is missing."""
    requirements, target, extra = _requirements(arch)
    wheelhouse = settings.cache("wheels", "base" if not extra else f"base-{arch}")
    lock = wheelhouse / "requirements.lock"
    inputs = hashlib.sha256(json.dumps([requirements, target.pip_args(), *([extra] if extra else [])]).encode()
                            ).hexdigest()
    header = f"# input-sha256: {inputs}\n"
    if lock.exists() and lock.read_text().startswith(header):
        text = lock.read_text()
        files = wheels.match_files(wheelhouse, wheels.parse_lock(text, str(lock)))
        if files is not None:
            return text, files
    with tempfile.TemporaryDirectory(dir=wheelhouse.parent, prefix=".base-dl-") as tmp:
        wheels.pip_download([*extra, *requirements], Path(tmp), target, settings.run_log("pip-download-base"), settings)
        lines = [header.rstrip("\n"),
                 f"# generated by builder.baseimage from {' '.join(requirements)}; sha256 computed by the tool"]
        for path in sorted(Path(tmp).iterdir(), key=lambda p: wheels.norm(p.name)):
            name, version = wheels.wheel_name_version(path.name)
            lines.append(f"{wheels.norm(name)}=={version} --hash=sha256:{fs.sha256_file(path)}  # {path.name}")
            os.replace(path, wheelhouse / path.name)
    text = "\n".join(lines) + "\n"
    lock.write_text(text)
    files = wheels.match_files(wheelhouse, wheels.parse_lock(text, str(lock)))
    if files is None:
        raise InfraError(f"{wheelhouse}: downloaded wheels do not match {lock}")
    log.info(f"base wheels: {len(files)} wheels in {wheelhouse}, lock {lock}")
    return text, files


# --------------------------------------------------------------------------- recipe


def _rootfs_recipe(arch: str | None = None) -> dict[str, Any]:
    return {"debootstrap": DEBOOTSTRAP if arch is None else {**DEBOOTSTRAP, "arch": arch}, "normalise": NORMALISE}


def _hash(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def recipe_hash(settings: Settings, lock_text: str | None = None, arch: str | None = None) -> str:
    """sha256 over the debootstrap options (+ normalisation), INSTALL, CONFIG and the wheel lock."""
    if lock_text is None:
        lock_text = base_lock(settings, arch)[0]
    return _hash({"schema": 2, "rootfs": _rootfs_recipe(arch), "install": INSTALL, "config": CONFIG,
                  "lock": lock_text})


# --------------------------------------------------------------------------- registry checks


def _registry_has(settings: Settings, repo_path: str, reference: str) -> str | None:
    """Docker-Content-Digest of repo_path:reference in the local registry, or None."""
    return Registry(infra.registry_url(), timeout_s=settings.registry_timeout_s).tag_digest(repo_path, reference)


def _repo_digest(repo_digests: list[str] | None) -> str | None:
    for ref in repo_digests or []:
        if ref.startswith(REPOSITORY + "@sha256:"):
            return str(ref)
    return None


def _cached(settings: Settings, client: Any, recipe: str) -> str | None:
    """The digest ref of an image with this recipe that is in the engine and in the registry. Read with one list call
    (no inspect per image): every image built FROM the base inherits its label, and tests remove theirs meanwhile."""
    repo_path = REPOSITORY.split("/", 1)[1]
    for image in client.api.images(filters={"label": f"{RECIPE_LABEL}={recipe}", "reference": REPOSITORY}):
        ref = _repo_digest(image.get("RepoDigests"))
        if ref and _registry_has(settings, repo_path, ref.split("@", 1)[1]) == ref.split("@", 1)[1]:
            if f"{REPOSITORY}:{recipe[:16]}" not in (image.get("RepoTags") or []):
                client.api.tag(image["Id"], REPOSITORY, recipe[:16])
            return ref
    return None


# --------------------------------------------------------------------------- build steps


def _normalise(root: Path) -> None:
    for rel in NORMALISE["remove_contents"]:
        target = root / rel
        if target.is_dir():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    for rel in NORMALISE["remove_files"]:
        (root / rel).unlink(missing_ok=True)
    doc = root / "usr/share/doc"
    if doc.is_dir():
        for path in sorted(doc.rglob("*"), reverse=True):
            if path.is_symlink() or path.is_file():
                if path.name != NORMALISE["keep_in_usr_share_doc"]:
                    path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
    for rel in NORMALISE["empty"]:
        (root / rel).write_text("")
    (root / "tmp").chmod(0o1777)
    (root / "var/tmp").chmod(0o1777)


def _rootfs_image(settings: Settings, client: Any, work: Path, mirror: str | None = None,
                  extra_args: Callable[[Path], list[str]] | None = None,
                  after: Callable[[Path, Path], None] | None = None, log_name: str = "debootstrap",
                  arch: str | None = None) -> str:
    """Tag of the imported rootfs image for this rootfs recipe (debootstrap once). Another distribution's
    rootfs (benchmarks/real_vllm_base.py) gives its mirror, extra debootstrap arguments (work -> args) and
    a step after debootstrap (rootfs, log file); another `arch` (arm64) runs emulated (binfmt, demo/arm64.py)."""
    rhash = _hash(_rootfs_recipe(arch))
    tag = f"{ROOTFS_REPOSITORY}:{rhash[:16]}"
    if client.images.list(filters={"label": f"{ROOTFS_LABEL}={rhash}", "reference": tag}):
        _set_arch(client, tag, arch, work)
        log.info(f"rootfs: reused {tag}")
        return tag
    if os.geteuid() != 0:
        raise InfraError("debootstrap: must run as root")
    if not shutil.which("debootstrap"):
        commands.apt_install(settings.run_log("apt"), "debootstrap")
    logfile = settings.cache("logs") / f"{log_name}.log"
    rootfs = work / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    d = _rootfs_recipe(arch)["debootstrap"]
    with log.step("base: debootstrap"):
        commands.run_logged(["debootstrap", f"--variant={d['variant']}", f"--arch={d['arch']}",
              *(extra_args(work) if extra_args else []),
              f"--components={','.join(d['components'])}", f"--include={','.join(d['include'])}",
              d["suite"], str(rootfs), mirror or settings.debian_mirror], logfile, "debootstrap", BuildFailed,
              every=settings.progress_every_s)
    if after:
        after(rootfs, logfile)
    with log.step("base: normalise + import rootfs"):
        _normalise(rootfs)
        changes = [f"LABEL {ROOTFS_LABEL}={rhash}", "ENV LANG=C.UTF-8",
                   "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["/bin/bash"]']
        # tar streams into the import (no 1 GB file written and read back); the tree is deleted beside the rest
        with open(logfile, "ab") as err, subprocess.Popen(
                ["tar", "--sort=name", "--numeric-owner", f"--mtime=@{NORMALISE['mtime']}", "--clamp-mtime",
                 "-C", str(rootfs), "-cf", "-", "."], stdout=subprocess.PIPE, stderr=err) as tar:
            stdout = tar.stdout
            assert stdout is not None  # PIPE
            out = client.api.import_image(src=iter(lambda: stdout.read(1 << 20), b""), stream_src=True,
                                          repository=ROOTFS_REPOSITORY, tag=rhash[:16], changes=changes)
        if tar.returncode != 0:
            raise BuildFailed(f"tar rootfs: exited {tar.returncode} while streaming into docker import; see {logfile}")
        if "error" in str(out).lower() and not client.images.list(filters={"reference": tag}):
            raise BuildFailed(f"docker import: {str(out)[:300]}")
        _LATER.append(threading.Thread(target=shutil.rmtree, args=(rootfs,), name="base-rootfs-rm"))
        _LATER[-1].start()
    _set_arch(client, tag, arch, work)
    log.info(f"rootfs: imported {tag}")
    return tag


def _set_arch(client: Any, tag: str, arch: str | None, work: Path) -> None:
    """The imported rootfs image says `arch`: this engine's import (20.10) always writes its own architecture, so a
    foreign rootfs is saved, its config's architecture set, and loaded again (the layer is unchanged)."""
    if arch is None or client.images.get(tag).attrs.get("Architecture") == arch:
        return
    old = client.images.get(tag)
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix=".arch-") as tmp:
        saved, fixed = Path(tmp) / "saved.tar", Path(tmp) / "fixed.tar"
        with open(saved, "wb") as out:
            for chunk in old.save(named=True):
                out.write(chunk)
        with tarfile.open(saved) as src, tarfile.open(fixed, "w") as dst:
            manifest = json.load(src.extractfile("manifest.json"))  # type: ignore[arg-type]
            config = json.load(src.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
            config.update({"architecture": arch, **({"variant": "v8"} if arch == "arm64" else {})})
            data = json.dumps(config, sort_keys=True).encode()
            name = hashlib.sha256(data).hexdigest() + ".json"
            skip = {"manifest.json", manifest[0]["Config"]}
            for member in src.getmembers():
                if member.name not in skip:
                    dst.addfile(member, src.extractfile(member) if member.isfile() else None)
            manifest[0]["Config"] = name
            for entry, body in ((name, data), ("manifest.json", json.dumps(manifest).encode())):
                info = tarfile.TarInfo(entry)
                info.size = len(body)
                dst.addfile(info, io.BytesIO(body))
        with open(fixed, "rb") as fh:
            client.images.load(fh)
    client.images.remove(old.id, noprune=False)
    log.info(f"rootfs: {tag} set to {arch} (was {old.attrs.get('Architecture')})")


def _stream(chunks: Iterable[dict[str, Any]], logfile: Path, what: str, error_type: type[Exception]) -> list[dict[str, Any]]:
    seen = []
    with open(logfile, "a") as out:
        for chunk in chunks:
            seen.append(chunk)
            if "stream" in chunk:
                out.write(chunk["stream"])
            elif "status" in chunk:
                out.write(f"{chunk.get('id', '')} {chunk['status']}\n")
            if "error" in chunk:
                out.write(f"ERROR: {chunk['error']}\n")
                out.flush()
                raise error_type(f"{what}: {chunk['error'].strip()[:300]}; see {logfile}")
    return seen


def _wheelhouse_tar(lock_text: str, files: dict[str, Path]) -> Path:
    """base/requirements.lock and base/wheels/* as one tar file (put_archive into /tmp)."""
    fd, name = tempfile.mkstemp(prefix="base-wheels-", suffix=".tar")
    os.close(fd)
    with tarfile.open(name, "w") as tar:
        data = lock_text.encode()
        info = tarfile.TarInfo("base/requirements.lock")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for path in sorted(files.values()):
            tar.add(path, arcname=f"base/wheels/{path.name}")
    return Path(name)


def _phases(output: str) -> dict[str, float]:
    """Seconds per INSTALL phase from its `@@phase NAME EPOCH` lines."""
    marks = [(line.split()[1], float(line.split()[2])) for line in output.splitlines() if line.startswith("@@phase ")]
    return {f"base: venv: {name}": round(end - start, 3) for (name, start), (_, end) in zip(marks, marks[1:])}


def _venv_image(settings: Settings, client: Any, rootfs: str, lock_text: str, files: dict[str, Path], tag: str,
                labels: dict[str, str], logfile: Path, arch: str | None = None) -> threading.Thread:
    """Run INSTALL in a network-none container of the rootfs and commit it as REPOSITORY:tag. The container's
    removal (its copy of the venv deleted: 10 s and more on a loaded disk) runs on in the returned thread, beside
    the push; a failure removes it before raising."""
    container = client.containers.create(rootfs, command=["/bin/sh", "-c", INSTALL], network_mode="none",
                                         user="0", working_dir="/",
                                         platform=None if arch is None else f"linux/{arch}")
    try:
        with log.step("base: venv: wheelhouse into the container"):
            archive = _wheelhouse_tar(lock_text, files)
            try:
                with open(archive, "rb") as fh:
                    container.put_archive("/tmp", fh)
            finally:
                archive.unlink()
        container.start()
        output = b""
        progress = log.Progress("base: venv", logfile, settings.progress_every_s)
        with open(logfile, "ab") as out:
            for chunk in container.logs(stream=True, follow=True):
                out.write(chunk)
                output += chunk
                progress.feed(chunk.decode(errors="replace"))
        rc = int(container.wait().get("StatusCode", 1))
        log.timings.update(_phases(output.decode(errors="replace")))
        if rc != 0:
            raise BuildFailed(f"demo base venv: the install exited {rc}; see {logfile}")
        label_line = "LABEL " + " ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items()))
        with log.step("base: venv: docker commit"):
            container.commit(repository=REPOSITORY, tag=tag, changes=[*CONFIG, label_line])
    except BaseException:
        container.remove(force=True)
        raise
    remover = threading.Thread(target=container.remove, kwargs={"force": True}, name="base-venv-container-rm")
    remover.start()
    return remover


def verify_from(settings: Settings, client: Any, ref: str) -> None:
    """A build `FROM <ref>` with network none must resolve the digest locally (no pull)."""
    dockerfile = (f"FROM {ref}\n"
                  "RUN [\"/opt/venv/bin/python\", \"-c\", \"import torch; print(torch.__version__)\"]\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile.encode())
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    buf.seek(0)
    logfile = settings.cache("logs") / "base-verify-from.log"
    chunks = _stream(client.api.build(fileobj=buf, custom_context=True, network_mode="none", pull=False,
                                      rm=True, forcerm=True, decode=True),
                     logfile, f"FROM {ref} (network none)", BuildFailed)
    image_id = next((c["aux"]["ID"] for c in chunks if isinstance(c.get("aux"), dict) and "ID" in c["aux"]), None)
    if image_id:
        try:
            client.images.remove(image_id, noprune=False)
        except Exception:
            pass


def ensure_base_image(settings: Settings, force: bool = False, arch: str | None = None) -> str:
    """Build (once per recipe), push and return `127.0.0.1:5000/demo/base@sha256:...`; `arch` another
    architecture's base (arm64, emulated: demo/arm64.py registers binfmt first)."""
    with fs.locked(settings.cache("demo", "base") / ".lock"):
        return _ensure_base_image(settings, force, arch)


def _ensure_base_image(settings: Settings, force: bool, arch: str | None = None) -> str:
    client = engine.connect(settings, timeout=600)
    if not infra.registry_answers():
        raise InfraError(f"registry {infra.registry_url()}: not answering; run `builder setup`")
    with log.step("base: wheels + lock"):
        lock_text, files = base_lock(settings, arch)
    recipe = recipe_hash(settings, lock_text, arch)
    tag = recipe[:16]
    if not force:
        ref = _cached(settings, client, recipe)
        if ref:
            log.info(f"base image: cached {ref} (recipe {recipe})")
            return ref

    work = settings.cache("demo", "base", tag)
    logfile = settings.cache("logs") / f"base-build-{tag}.log"
    rootfs = _rootfs_image(settings, client, work, arch=arch)
    torch = _requirements(arch)[0][0].replace("torch==", "torch ").removesuffix("+cpu")
    with log.step("base: venv in a network-none container + commit"):
        remover = _venv_image(settings, client, rootfs, lock_text, files, tag,
                    {RECIPE_LABEL: recipe, "org.opencontainers.image.title": f"demo base ({torch} cpu)",
                     "io.truepolicy.demo.base.rootfs": rootfs}, logfile, arch)
    with log.step("base: push"):
        ref = basepush.push(client, settings, REPOSITORY, tag, work / "push")
        image = client.images.get(f"{REPOSITORY}:{tag}")
        registry_digest = _registry_has(settings, REPOSITORY.split("/", 1)[1], tag)
        if ref not in (image.attrs.get("RepoDigests") or []) or registry_digest != ref.split("@", 1)[1]:
            raise PublishError(f"{REPOSITORY}:{tag}: engine digest {ref} != registry digest {registry_digest}")
    basepush.behind(settings, image.id, infra.registry_url())  # runs on beside the build that follows
    with log.step("base: verify FROM digest (network none)"):
        verify_from(settings, client, ref)
    with log.step("base: venv container and rootfs tree removed (beside the push)"):
        for thread in [remover, *_LATER]:
            thread.join()
        _LATER.clear()
    size = image.attrs.get("Size")
    record = {"ref": ref, "tag": f"{REPOSITORY}:{tag}", "recipe": recipe, "image_id": image.id, "size": size,
              "rootfs": rootfs, "timings": {k: v for k, v in log.timings.items() if k.startswith("base:")}}
    (work / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    log.info(f"base image: built {ref} ({size / 1e6:.0f} MB), log {logfile}")
    return ref
