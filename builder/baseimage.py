"""The demo base image (stands in for a vendor base such as nvcr.io/nvidia/pytorch).

    debootstrap --variant=minbase bookworm  ->  normalise + `docker import`  (rootfs image)
    -> `docker build` (SDK, network none) of dockerfiles/demo-base.Dockerfile with a wheelhouse:
       /opt/venv holding CPU torch 2.13.0 + deps + setuptools + wheel, installed offline
       (--no-index --require-hashes), wheelhouse left behind in a build stage
    -> push 127.0.0.1:5000/demo/base:<recipe hash[:16]>  ->  127.0.0.1:5000/demo/base@sha256:...

Wheels are downloaded on the host (`pip download`) into cache_dir('wheels', 'base') and pinned in
a lock with our own sha256 of each file.  The recipe hash covers the debootstrap options, the
Dockerfile text and that lock; an image labelled with it that is in the engine AND in the registry
is reused as is.  Run as `python -m builder.baseimage [--pins PINS] [--lock LOCK]`.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from builder import engine, infra, log, options
from builder.errors import BadInput, BuildFailed, BuilderError, InfraError, PublishError
from builder.paths import PROJECT, cache_dir

REPOSITORY = f"{infra.registry_url()}/demo/base"
DOCKERFILE = PROJECT / "dockerfiles" / "demo-base.Dockerfile"
RECIPE_LABEL = "io.truepolicy.demo.base.recipe"
ROOTFS_LABEL = "io.truepolicy.demo.rootfs.recipe"
ROOTFS_REPOSITORY = "builder-demo/rootfs"  # local only, never pushed

# What goes into the rootfs (part of the recipe).  The mirror is where it comes from, not what it is.
DEBOOTSTRAP = {
    "suite": "bookworm",
    "variant": "minbase",
    "arch": "amd64" if platform.machine() in ("x86_64", "AMD64") else "arm64",
    "components": ["main"],
    "include": ["python3", "python3-venv", "python3-dev", "gcc", "libc6-dev"],
}
# Removed from the rootfs before import (part of the recipe: change it and the image changes).
NORMALISE = {
    "version": 1,
    "remove_contents": ["var/cache/apt/archives", "var/lib/apt/lists", "var/log", "tmp", "var/tmp",
                        "run", "dev", "proc", "sys", "usr/share/man", "usr/share/info", "usr/share/locale"],
    "remove_files": ["var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin", "etc/resolv.conf",
                     "etc/hostname", "var/cache/debconf/templates.dat-old", "var/lib/dpkg/status-old"],
    "keep_in_usr_share_doc": "copyright",
    "empty": ["etc/machine-id"],
    "mtime": 0,
}
# Inputs of the wheel lock (the lock pins the full resolved set).
BASE_REQUIREMENTS = ["torch==2.13.0+cpu", "setuptools==84.2.1", "wheel==0.48.0"]
TARGET_PYTHON = "3.11"

_REQ_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
_HASH_RE = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
_DIGEST_REF_RE = re.compile(r"^[a-z0-9][a-z0-9.:_/-]*@sha256:[0-9a-f]{64}$")


# --------------------------------------------------------------------------- hashing + locks


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str, where: str = "lock") -> list[tuple[str, str, list[str]]]:
    """`name==version --hash=sha256:<hex> ...` entries (comments, continuations allowed)."""
    entries = []
    logical = re.sub(r"\\\n", " ", text)
    for lineno, line in enumerate(logical.splitlines(), 1):
        line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
        if not line:
            continue
        words = line.split()
        req = _REQ_RE.match(words[0])
        if not req:
            raise BadInput(f"{where}:{lineno}: expected name==version, got {words[0]!r}")
        hashes = []
        for word in words[1:]:
            match = _HASH_RE.match(word)
            if not match:
                raise BadInput(f"{where}:{lineno}: expected --hash=sha256:<64 hex>, got {word!r}")
            hashes.append(match.group(1))
        if not hashes:
            raise BadInput(f"{where}:{lineno}: {words[0]} has no --hash=sha256:")
        entries.append((req.group(1), req.group(2), hashes))
    if not entries:
        raise BadInput(f"{where}: no requirements")
    return entries


def _target_args() -> list[str]:
    """pip download options for the image's interpreter (CPython 3.11, glibc 2.36), not the host's."""
    machine = "x86_64" if DEBOOTSTRAP["arch"] == "amd64" else "aarch64"
    args = ["--only-binary=:all:", "--python-version", TARGET_PYTHON, "--implementation", "cp"]
    for abi in ("cp311", "abi3", "none"):
        args += ["--abi", abi]
    for plat in ("manylinux_2_28", "manylinux_2_17", "manylinux2014"):
        args += ["--platform", f"{plat}_{machine}"]
    return args


def _pip_download(args: list[str], dest: Path, logname: str) -> None:
    logfile = cache_dir("logs") / logname
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d", str(dest),
            *_target_args(), *args]
    _run(argv, logfile, "pip download", InfraError)


def _wheel_name_version(filename: str) -> tuple[str, str]:
    if not filename.endswith(".whl"):
        raise InfraError(f"{filename}: not a wheel (only wheels are installed offline)")
    parts = filename[:-4].split("-")
    return parts[0], parts[1]


def _verify_dir(directory: Path, entries) -> dict[str, Path] | None:
    """Map each locked requirement to a file in `directory` whose sha256 it lists; None if any is missing."""
    by_hash = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            by_hash.setdefault(sha256_file(path), path)
    found = {}
    for name, version, hashes in entries:
        match = next((by_hash[h] for h in hashes if h in by_hash), None)
        if match is None:
            return None
        found[f"{name}=={version}"] = match
    return found


def base_lock() -> tuple[str, dict[str, Path]]:
    """(lock text, {req: wheel path}) for the base venv; downloads only when the inputs changed
    or a wheel is missing."""
    wheels = cache_dir("wheels", "base")
    lock = wheels / "requirements.lock"
    inputs = hashlib.sha256(json.dumps([BASE_REQUIREMENTS, _target_args()]).encode()).hexdigest()
    header = f"# input-sha256: {inputs}\n"
    if lock.exists() and lock.read_text().startswith(header):
        text = lock.read_text()
        files = _verify_dir(wheels, parse_lock(text, str(lock)))
        if files is not None:
            return text, files
    with tempfile.TemporaryDirectory(dir=wheels.parent, prefix=".base-dl-") as tmp:
        _pip_download(BASE_REQUIREMENTS, Path(tmp), "pip-download-base.log")
        lines = [header.rstrip("\n"),
                 f"# generated by builder.baseimage from {' '.join(BASE_REQUIREMENTS)}; sha256 computed by the tool"]
        for path in sorted(Path(tmp).iterdir(), key=lambda p: _norm(p.name)):
            name, version = _wheel_name_version(path.name)
            lines.append(f"{_norm(name)}=={version} --hash=sha256:{sha256_file(path)}  # {path.name}")
            os.replace(path, wheels / path.name)
    text = "\n".join(lines) + "\n"
    lock.write_text(text)
    files = _verify_dir(wheels, parse_lock(text, str(lock)))
    if files is None:
        raise InfraError(f"{wheels}: downloaded wheels do not match {lock}")
    log.info(f"base wheels: {len(files)} wheels in {wheels}, lock {lock}")
    return text, files


def ensure_wheels(lock_path) -> Path:
    """Wheels for a hashed lock (pip requirements with --hash=sha256:), downloaded once into
    cache_dir('wheels', 'lock', <sha256 of the lock>[:16]) and verified against the lock."""
    lock_path = Path(lock_path)
    try:
        data = lock_path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{lock_path}: expected a readable lock file ({exc.strerror})") from None
    entries = parse_lock(data.decode(), str(lock_path))
    dest = cache_dir("wheels", "lock", hashlib.sha256(data).hexdigest()[:16])
    with infra.locked(dest.parent / f".{dest.name}.lock"):
        return _ensure_wheels(lock_path, entries, dest)


def _ensure_wheels(lock_path: Path, entries, dest: Path) -> Path:
    if _verify_dir(dest, entries) is not None:
        log.info(f"wheels for {lock_path}: reused {dest}")
        return dest
    with log.step(f"pip download {lock_path.name}"):
        _pip_download(["--no-deps", "--require-hashes", "-r", str(lock_path)], dest, "pip-download-lock.log")
    if _verify_dir(dest, entries) is None:
        raise InfraError(f"{dest}: downloaded wheels do not match the hashes in {lock_path}")
    log.info(f"wheels for {lock_path}: {len(entries)} in {dest}")
    return dest


# --------------------------------------------------------------------------- recipe


def _rootfs_recipe() -> dict:
    return {"debootstrap": DEBOOTSTRAP, "normalise": NORMALISE}


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def recipe_hash(lock_text: str | None = None) -> str:
    """sha256 over the debootstrap options (+ normalisation), the Dockerfile text and the wheel lock."""
    if lock_text is None:
        lock_text = base_lock()[0]
    return _hash({"schema": 1, "rootfs": _rootfs_recipe(), "dockerfile": DOCKERFILE.read_text(), "lock": lock_text})


# --------------------------------------------------------------------------- registry checks


def _registry_has(repo_path: str, reference: str) -> str | None:
    """Docker-Content-Digest of repo_path:reference in the local registry, or None."""
    from builder.registry import Registry

    return Registry(infra.registry_url()).tag_digest(repo_path, reference)


def _repo_digest(image) -> str | None:
    for ref in image.attrs.get("RepoDigests") or []:
        if ref.startswith(REPOSITORY + "@sha256:"):
            return ref
    return None


def _cached(client, recipe: str) -> str | None:
    """The digest ref of an image with this recipe that is in the engine and in the registry."""
    repo_path = REPOSITORY.split("/", 1)[1]
    for image in client.images.list(filters={"label": f"{RECIPE_LABEL}={recipe}"}):
        ref = _repo_digest(image)
        if ref and _registry_has(repo_path, ref.split("@", 1)[1]) == ref.split("@", 1)[1]:
            tag = f"{REPOSITORY}:{recipe[:16]}"
            if tag not in (image.tags or []):
                image.tag(REPOSITORY, recipe[:16])
            return ref
    return None


# --------------------------------------------------------------------------- build steps


def _run(argv: list[str], logfile: Path, what: str, error=BuildFailed) -> None:
    """Run a host command with its output appended to logfile; `error` on a non-zero exit."""
    with open(logfile, "ab") as out:
        out.write(("$ " + " ".join(argv) + "\n").encode())
        out.flush()
        rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if rc != 0:
        raise error(f"{what}: exit {rc}; see {logfile}: {infra._tail(logfile, 5)}")


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


def _rootfs_image(client, work: Path) -> str:
    """Tag of the imported rootfs image for this rootfs recipe (debootstrap once)."""
    rhash = _hash(_rootfs_recipe())
    tag = f"{ROOTFS_REPOSITORY}:{rhash[:16]}"
    if client.images.list(filters={"label": f"{ROOTFS_LABEL}={rhash}", "reference": tag}):
        log.info(f"rootfs: reused {tag}")
        return tag
    if os.geteuid() != 0:
        raise InfraError("debootstrap: must run as root")
    if not shutil.which("debootstrap"):
        infra._apt_install("debootstrap")
    logfile = cache_dir("logs") / "debootstrap.log"
    rootfs = work / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    d = DEBOOTSTRAP
    with log.step("base: debootstrap"):
        _run(["debootstrap", f"--variant={d['variant']}", f"--arch={d['arch']}",
              f"--components={','.join(d['components'])}", f"--include={','.join(d['include'])}",
              d["suite"], str(rootfs), options.debian_mirror()], logfile, "debootstrap")
    tar_path = work / "rootfs.tar"
    with log.step("base: normalise + import rootfs"):
        _normalise(rootfs)
        _run(["tar", "--sort=name", "--numeric-owner", f"--mtime=@{NORMALISE['mtime']}", "--clamp-mtime",
              "-C", str(rootfs), "-cf", str(tar_path), "."], logfile, "tar rootfs")
        shutil.rmtree(rootfs)
        changes = [f"LABEL {ROOTFS_LABEL}={rhash}", "ENV LANG=C.UTF-8",
                   "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["/bin/bash"]']
        out = client.api.import_image_from_file(str(tar_path), repository=ROOTFS_REPOSITORY, tag=rhash[:16],
                                                changes=changes)
        tar_path.unlink()
        if "error" in str(out).lower() and not client.images.list(filters={"reference": tag}):
            raise BuildFailed(f"docker import: {str(out)[:300]}")
    log.info(f"rootfs: imported {tag}")
    return tag


def _stream(chunks, logfile: Path, what: str, error_type) -> list[dict]:
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


def _context_dir(work: Path, lock_text: str, files: dict[str, Path]) -> Path:
    ctx = work / "context"
    if ctx.exists():
        shutil.rmtree(ctx)
    (ctx / "wheels").mkdir(parents=True)
    shutil.copyfile(DOCKERFILE, ctx / "Dockerfile")
    (ctx / "requirements.lock").write_text(lock_text)
    for path in files.values():
        try:
            os.link(path, ctx / "wheels" / path.name)
        except OSError:
            shutil.copyfile(path, ctx / "wheels" / path.name)
    return ctx


def _remove_stage_images(client, chunks: list[dict]) -> None:
    """Drop the untagged result of each non-final stage (it holds the wheelhouse layer)."""
    text = "".join(c.get("stream", "") for c in chunks)
    last_id, stage_ids = None, []
    for line in text.splitlines():
        if re.match(r"^Step \d+/\d+ : FROM ", line) and last_id:
            stage_ids.append(last_id)
        match = re.match(r"^---> ([0-9a-f]{12})$", line.strip())
        if match:
            last_id = match.group(1)
    for image_id in stage_ids:
        try:
            if not client.images.get(image_id).tags:
                client.images.remove(image_id)
        except Exception:  # already gone or used elsewhere: leave it
            pass


def verify_from(client, ref: str) -> None:
    """A build `FROM <ref>` with network none must resolve the digest locally (no pull)."""
    dockerfile = (f"FROM {ref}\n"
                  "RUN [\"/opt/venv/bin/python\", \"-c\", \"import torch; print(torch.__version__)\"]\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile.encode())
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
    buf.seek(0)
    logfile = cache_dir("logs") / "base-verify-from.log"
    chunks = _stream(client.api.build(fileobj=buf, custom_context=True, network_mode="none", pull=False,
                                      rm=True, forcerm=True, decode=True),
                     logfile, f"FROM {ref} (network none)", BuildFailed)
    image_id = next((c["aux"]["ID"] for c in chunks if isinstance(c.get("aux"), dict) and "ID" in c["aux"]), None)
    if image_id:
        try:
            client.images.remove(image_id, noprune=False)
        except Exception:
            pass


def ensure_base_image(force: bool = False) -> str:
    """Build (once per recipe), push and return `127.0.0.1:5000/demo/base@sha256:...`."""
    with infra.locked(cache_dir("demo", "base") / ".lock"):
        return _ensure_base_image(force)


def _ensure_base_image(force: bool) -> str:
    client = engine.connect(timeout=600)
    if not infra.registry_answers():
        raise InfraError(f"registry {infra.registry_url()}: not answering; run `builder setup`")
    with log.step("base: wheels + lock"):
        lock_text, files = base_lock()
    recipe = recipe_hash(lock_text)
    tag = recipe[:16]
    if not force:
        ref = _cached(client, recipe)
        if ref:
            log.info(f"base image: cached {ref} (recipe {recipe})")
            return ref

    work = cache_dir("demo", "base", tag)
    logfile = cache_dir("logs") / f"base-build-{tag}.log"
    rootfs = _rootfs_image(client, work)
    with log.step("base: docker build (network none)"):
        ctx = _context_dir(work, lock_text, files)
        chunks = _stream(client.api.build(path=str(ctx), dockerfile="Dockerfile", tag=f"{REPOSITORY}:{tag}",
                                          buildargs={"ROOTFS": rootfs}, network_mode="none", pull=False,
                                          rm=True, forcerm=True, decode=True,
                                          labels={RECIPE_LABEL: recipe,
                                                  "org.opencontainers.image.title": "demo base (torch 2.13.0 cpu)",
                                                  "io.truepolicy.demo.base.rootfs": rootfs}),
                         logfile, "docker build demo base", BuildFailed)
        shutil.rmtree(ctx)
        _remove_stage_images(client, chunks)
        if not any("aux" in c for c in chunks) and not client.images.list(filters={"reference": f"{REPOSITORY}:{tag}"}):
            raise BuildFailed(f"docker build demo base: no image; see {logfile}")
    with log.step("base: push"):
        _stream(client.api.push(REPOSITORY, tag=tag, stream=True, decode=True),
                logfile, f"docker push {REPOSITORY}:{tag}", PublishError)
        image = client.images.get(f"{REPOSITORY}:{tag}")
        ref = _repo_digest(image)
        registry_digest = _registry_has(REPOSITORY.split("/", 1)[1], tag)
        if not ref or registry_digest != ref.split("@", 1)[1]:
            raise PublishError(f"{REPOSITORY}:{tag}: engine digest {ref} != registry digest {registry_digest}")
    with log.step("base: verify FROM digest (network none)"):
        verify_from(client, ref)
    size = image.attrs.get("Size")
    record = {"ref": ref, "tag": f"{REPOSITORY}:{tag}", "recipe": recipe, "image_id": image.id, "size": size,
              "rootfs": rootfs, "timings": {k: v for k, v in log.timings.items() if k.startswith("base:")}}
    (work / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    log.info(f"base image: built {ref} ({size / 1e6:.0f} MB), log {logfile}")
    return ref


# --------------------------------------------------------------------------- pins


def write_demo_pins_digest(pins_path, ref: str) -> bool:
    """Rewrite only the `image:` line under `base:` in a pins YAML file (comments kept).
    Returns True when the file changed."""
    if not _DIGEST_REF_RE.match(ref):
        raise BadInput(f"base.image: expected <name>@sha256:<64 hex>, got {ref!r}")
    pins_path = Path(pins_path)
    try:
        lines = pins_path.read_text().splitlines(keepends=True)
    except OSError as exc:
        raise BadInput(f"{pins_path}: expected a readable pins file ({exc.strerror})") from None
    in_base = False
    for i, line in enumerate(lines):
        if re.match(r"^base:\s*(#.*)?$", line):
            in_base = True
            continue
        if in_base and re.match(r"^\S", line):  # next top-level key
            break
        match = re.match(r"^(\s+image:\s*)(\"[^\"]*\"|'[^']*'|[^\s#]+)?(\s*(?:#.*)?)(\r?\n)?$", line) if in_base else None
        if match:
            old = (match.group(2) or "").strip("\"'")
            if old == ref:
                return False
            lines[i] = f"{match.group(1)}{ref}{match.group(3)}{match.group(4) or ''}"
            pins_path.write_text("".join(lines))
            log.info(f"{pins_path}: base.image changed {old or '(empty)'} -> {ref}")
            return True
    raise BadInput(f"{pins_path}: base.image: expected an `image:` line under `base:`")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m builder.baseimage", description=__doc__.splitlines()[0])
    parser.add_argument("--pins", help="pins YAML whose base.image to set to the digest")
    parser.add_argument("--lock", action="append", default=[], help="also fetch the wheels of this hashed lock")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--recipe", action="store_true", help="print the recipe hash and exit")
    args = parser.parse_args(argv)
    try:
        if args.recipe:
            print(recipe_hash())
            return 0
        for lock in args.lock:
            print(ensure_wheels(lock))
        ref = ensure_base_image(force=args.force)
        if args.pins:
            write_demo_pins_digest(args.pins, ref)
    except BuilderError as exc:
        log.info(f"error: {exc}")
        return exc.exit_code
    print(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
