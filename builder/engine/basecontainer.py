"""Run a Python script in a fresh network-none container of the pins' base image (never the host).

Used by `builder lock` to read what the base provides (interpreter, ABI, platform, installed
distributions), to prepare a component's metadata with its build requirements from the
wheelhouse, and to build wheels of sdist-only dependencies. Files go in through put_archive
(no mounts); results come back on stdout after a marker line, or as a tar of one directory.
"""
from __future__ import annotations

import hashlib
import io
import json
import platform as host_platform
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core import faults, resources
from builder.core.errors import BadInput, BuilderError, BuildFailed, InfraError
from builder.core.imageref import ImageRef, by_digest
from builder.core.options import Settings
from builder.engine import client as engine
from builder.engine import platforms, registry

WORK = "/tmp/lock"
MARKER = "@@builder-lock-result@@"
MACHINES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}

BASE_QUERY = resources.container_script("engine", "base_query.py")  # what the base provides


@dataclass(frozen=True)
class BaseInfo:
    """What the base image is, read from the base itself."""
    image: str
    python: str  # "3.11"
    abi: str  # "cp311"
    machine: str  # "x86_64"
    glibc: tuple[int, int]
    markers: dict[str, str] = field(default_factory=dict)
    dists: dict[str, str] = field(default_factory=dict)  # distribution name -> version
    # torch, torchvision, torchaudio: [version, <dist-info>/RECORD, sha256 of that RECORD] (kept as they are)
    records: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    archive: bytes = b""
    log: str = ""  # this run's log of the container (stdout and stderr whole)

    def payload(self) -> Any:
        """The JSON printed after the marker line."""
        _, sep, rest = self.stdout.partition(MARKER)
        if not sep:
            raise BuildFailed(f"base container: no result (exit {self.rc}): {self.cause()}")
        return json.loads(rest)

    def cause(self) -> str:
        """The line that says why it failed (not a wrapper's argv), and the log that has the rest."""
        return f"{cause(self.stderr + chr(10) + self.stdout)}; log {self.log}"


ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b:?|ERROR:|error:|fatal:|(?:\S+: )?No module named)")
WRAPPERS = ("subprocess.CalledProcessError", "CalledProcessError", "error: subprocess-exited-with-error",
            "error: metadata-generation-failed", "ERROR: Failed building wheel", "error: legacy-install-failure",
            "ERROR: Failed to build")


def cause(output: str, width: int = 160) -> str:
    """The first error line of a failed tool's output that is not a wrapper reporting a child's exit
    (e.g. `AssertionError: CUDA_HOME is not set`, `... No module named pip`), else its last line; clipped."""
    lines = [" ".join(ln.strip(" \u2502\u2570\u2500>").split()) for ln in output.splitlines() if ln.strip()]
    found = [ln for ln in lines if ERROR_LINE.match(ln) and not ln.startswith(WRAPPERS)]
    ends = [i for i, ln in enumerate(lines) if ln == "[end of output]"]  # pip's box around a child's output
    child = [lines[i - 1] for i in ends if i > 0 and not lines[i - 1].endswith("lines of output]")]
    line = found[0] if found else child[-1] if child else lines[-1] if lines else "no output"
    return line if len(line) <= width else line[: width - 3] + "..."


# pip's refusal of a distribution whose Requires-Python the interpreter does not meet (pip 21 .. 26)
REQUIRES_PYTHON = re.compile(r"ERROR: Package '([^']+)' requires a different Python: (\S+) not in '([^']*)'")


def failure(result: Result, where: str, doing: str, base_python: str) -> BuilderError:
    """The error of a failed run in the base, by its cause: a distribution whose Requires-Python the base's
    interpreter does not meet is a pins/base mismatch, bad input (2) naming both sides; a full disk is
    infrastructure (3); anything else failed the build (1)."""
    output = result.stderr + "\n" + result.stdout
    found = REQUIRES_PYTHON.search(output)
    if found:
        package, have, spec = found.groups()
        return BadInput(f"{where}: {package} requires Python {spec} (its Requires-Python), but the base has Python"
                        f" {have} (base.python: {base_python}); pin a base whose Python meets it, or a {package} that"
                        f" supports Python {base_python}; log {result.log}")
    disk = faults.disk_message(output)
    if disk:
        return InfraError(f"{where}: {doing} in the base: disk: {disk}; log {result.log}")
    return BuildFailed(f"{where}: {doing} failed in the base (exit {result.rc}): {result.cause()}")


def tar_bytes(files: dict[str, bytes], dirs: tuple[str, ...] = ()) -> bytes:
    """A tar of {path below /: content}, readable and writable by everyone (the base may run as any user)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for directory in sorted({str(Path(p).parent) for p in files} | {WORK.lstrip("/")} | set(dirs)):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o777
            tar.addfile(info)
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pull_base(client: engine.Client, image: str, settings: Settings) -> bool:
    """Make the base `name@sha256:...` local: nothing when the engine has it, else pulled by digest (the engine
    checks the content) with its own host's credentials only, the registry keychain's auth_config (BUILDER_REGISTRY_*
    where they belong to that host, config.json, auth.json), never another host's. False when it could not."""
    if engine.inspect_image(client, image) is not None:
        return True
    host = ImageRef(image).registry or "docker.io"
    return engine.pull_by_digest(client, image, registry.auth_config(host, settings))


def run(settings: Settings, image: str, python: str, script: str, archives: list[tuple[str, bytes]] | None = None,
        env: dict[str, str] | None = None, fetch: str | None = None, log_name: str = "base-container",
        args: list[str] | None = None) -> Result:
    """Run `python -c script` in a fresh network-none container of image, with each (directory, tar)
    of archives extracted there in order; `fetch` is a directory returned as tar bytes. Container removed after."""
    import docker  # lazy: docker SDK, slow to import; start-up

    client = engine.connect(settings)
    spec: dict[str, Any] = {"command": [python, "-B", "-c", script, *(args or [])], "network_mode": "none",
                            "environment": env or {}, "working_dir": "/tmp", "user": "0", "labels": engine.owner_labels()}
    try:
        container = client.containers.create(image, **spec)
    except docker.errors.ImageNotFound:
        if not pull_base(client, image, settings):  # as a build's FROM needs it
            raise BadInput(f"base.image: {image} is not in the local engine (pull or build it first)") from None
        container = client.containers.create(image, **spec)
    try:
        for where, archive in archives or []:
            container.put_archive(where, archive)
        try:
            container.start()
        except docker.errors.APIError as exc:  # the interpreter is not there: the container never ran
            if engine.unreachable(exc):
                raise
            why = str(exc.explanation or exc)
            rc, out, err = 127, "", "error: " + why[why.find("exec: "):] if "exec: " in why else why
        else:
            rc = int(container.wait().get("StatusCode", 1))
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            err = container.logs(stdout=False, stderr=True).decode(errors="replace")
        log = settings.run_log(log_name)
        log.write_text(f"exit {rc}\n--- stdout\n{out}\n--- stderr\n{err}\n")
        data = b""
        if fetch and rc == 0:
            stream, _ = container.get_archive(fetch)
            data = b"".join(stream)
        return Result(rc, out, err, data, str(log))
    finally:
        container.remove(force=True)


def _abi(soabi: str, python: str) -> str:
    """cp311 from 'cpython-311-x86_64-linux-gnu'."""
    parts = soabi.split("-")
    if len(parts) >= 2 and parts[0] == "cpython":
        return f"cp{parts[1]}"
    return "cp" + python.replace(".", "")


def read_base(settings: Settings, image: str, python_bin: str, pins_python: str, pins_platform: str) -> BaseInfo:
    """Query the base in a network-none container (once per digest, interpreter and host kernel: an image
    by digest never changes) and check it against the pins' base fields."""
    key = hashlib.sha256(json.dumps([image, python_bin, host_platform.release(), BASE_QUERY]).encode()).hexdigest()
    cached = settings.cache("lock", "base") / f"{key[:32]}.json"
    if by_digest(image) is not None and cached.is_file():
        data = json.loads(cached.read_text())
    else:
        result = run(settings, image, python_bin, BASE_QUERY, log_name="lock-base-query")
        if result.rc != 0:
            raise BadInput(f"base.python_bin: {python_bin} does not run in {image} (exit {result.rc}):"
                           f" {result.cause()}")
        data = result.payload()
        cached.write_text(json.dumps(data, sort_keys=True))
    if data["python"] != pins_python:
        raise BadInput(f"base.python: pinned {pins_python!r}, the base's {python_bin} is Python {data['python']}")
    if data["impl"] != "cpython":
        raise BadInput(f"base.python_bin: expected CPython, the base has {data['impl']}")
    if MACHINES[pins_platform] != data["machine"]:
        raise BadInput(f"base.platform: pinned {pins_platform}, the base's interpreter runs on {data['machine']}")
    if data["libc"][0] != "glibc":
        raise BadInput(f"base.image: expected a glibc base (manylinux wheels), found {data['libc'][0] or 'no libc'}")
    if not platforms.runs_here(data["machine"]):
        raise BadInput(f"base.platform: {pins_platform} base on a {host_platform.machine()} host:"
                       " metadata and sdists are prepared in base containers, which must run here"
                       " (natively, or emulated: register qemu-user-static's binfmt entry)")
    major, minor = (int(x) for x in data["libc"][1].split(".")[:2])
    return BaseInfo(image=image, python=data["python"], abi=_abi(data["soabi"], data["python"]),
                    machine=data["machine"], glibc=(major, minor), markers=data["markers"], dists=data["dists"],
                    records=data.get("records", {}))
