"""The Docker engine, through the SDK's low-level API: connect, build a context tar, inspect/tag/remove.

Orchestration (which context, which tag, records) lives in builder/image/build.py.
Every build runs with network_mode "none", pull=False, and intermediate containers removed.
"""
from __future__ import annotations

import io
import os
import re
import socket
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import requests

from builder.core import files as fs
from builder.core import log
from builder.core.errors import BuildFailed, InfraError
from builder.core.imageref import ImageRef
from builder.core.options import Settings

STEP_RX = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
LAYER_RX = re.compile(r"^---> ([0-9a-f]{12})$")
Client = Any  # docker.DockerClient (the SDK ships no type hints)
OWNER_LABEL = "io.truepolicy.owner"  # value: <host name>:<pid> of the builder process that made the container
_swept: set[str] = set()  # engines this process has swept for orphans
_clients: dict[tuple[Any, ...], Any] = {}  # (host, timeout, environment) -> an SDK client that answered ping


@dataclass
class Step:
    index: int
    total: int
    instruction: str
    seconds: float = 0.0
    cached: bool = False
    image: str = ""  # short ID of the image this step produced (or reused)
    lines: list[str] = field(default_factory=list)


@dataclass
class BuildResult:
    image_id: str
    steps: list[Step]
    seconds: float
    log_path: str


def connect(settings: Settings, timeout: float | None = None) -> Client:
    """A docker SDK client for the settings' engine that answered ping, else InfraError (exit 3).
    `timeout` is the HTTP read timeout (default: the build timeout; a step may print nothing for minutes)."""
    import docker  # lazy: docker SDK, slow to import; start-up

    key = (settings.docker_host, int(timeout or settings.build_timeout_s), tuple(sorted(settings.docker_environment().items())))
    client = _clients.pop(key, None)  # one client per engine and timeout in a process: no socket left to the GC
    try:
        if client is None:
            client = docker.from_env(timeout=key[1], environment=settings.docker_environment(),
                                     use_ssh_client=(settings.docker_host or "").startswith("ssh://"))
        client.ping()
        _clients[key] = client
    except Exception as exc:  # DockerException, requests errors, socket errors
        if client is not None:
            client.close()
        where = f"docker engine {settings.docker_host}" if settings.docker_host else "docker engine"
        raise InfraError(f"{where}: not reachable ({type(exc).__name__}: {str(exc)[:200]});"
                         " start it with `builder setup`") from None
    if client.api.base_url not in _swept:
        _swept.add(client.api.base_url)
        sweep_orphans(client)
    return client


def owner_labels() -> dict[str, str]:
    """On every container a run creates: which process on which host made it (see sweep_orphans)."""
    return {OWNER_LABEL: f"{socket.gethostname()}:{os.getpid()}"}


def sweep_orphans(client: Client) -> list[str]:
    """Remove the containers that a builder process on this host, now gone (SIGKILL, power loss), left on
    the engine; a live process's containers are kept. Returns their IDs."""
    import docker  # lazy: docker SDK, slow to import; start-up

    host, removed = socket.gethostname(), []
    try:
        for container in client.containers.list(all=True, filters={"label": OWNER_LABEL}):
            owner, _, pid = str(container.labels.get(OWNER_LABEL, "")).rpartition(":")
            if owner == host and pid.isdigit() and not fs.alive(int(pid)):
                container.remove(force=True)
                removed.append(container.id)
    except docker.errors.NotFound:  # another sweeper was quicker
        pass
    if removed:
        print(f"removed {len(removed)} container(s) that a killed builder left", file=sys.stderr, flush=True)
    return removed


def facts(client: Client) -> dict[str, Any]:
    """Who the engine is: ID, host name, version, and the GPU runtimes/resources it reports."""
    info, version = client.info(), client.version()
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    return {"id": info.get("ID"), "host": info.get("Name"), "version": version.get("Version"),
            "os": info.get("OperatingSystem"), "arch": info.get("Architecture"),
            "gpus": {"runtimes": [r for r in runtimes if "nvidia" in r],
                     "generic_resources": info.get("GenericResources") or []},
            "data_root": info.get("DockerRootDir")}


def engine_version(client: Client) -> str:
    return str(client.version().get("Version", "unknown"))


def inspect_image(client: Client, ref: str) -> dict[str, Any] | None:
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        attrs: dict[str, Any] = client.api.inspect_image(ref)
        return attrs
    except docker.errors.ImageNotFound:
        return None


def image_id(client: Client, ref: str) -> str | None:
    """The full ID (`sha256:<config digest>`) of a local image or tag; None when the engine has none."""
    attrs = inspect_image(client, ref)
    return str(attrs["Id"]) if attrs else None


@dataclass(frozen=True)
class LocalImage:
    id: str
    tags: tuple[str, ...]
    size: int
    created: int


def local_images(client: Client, name: str) -> list[LocalImage]:
    """The local images whose repository matches `name` (a glob like `repo/*`), newest first."""
    found = [LocalImage(str(i["Id"]), tuple(i.get("RepoTags") or ()), int(i.get("Size") or 0), int(i.get("Created") or 0))
             for i in client.api.images(name=name)]
    return sorted(found, key=lambda image: image.created, reverse=True)


def save_image(client: Client, image: str, out: IO[bytes], chunk_size: int) -> bool:
    """Stream `docker save <image>` into `out`; False when the engine has no such image."""
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        for chunk in client.api.get_image(image, chunk_size=chunk_size):
            out.write(chunk)
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as exc:
        if exc.response is not None and exc.response.status_code == 404:
            return False
        raise InfraError(f"docker engine: docker save {image}: {exc}") from None
    return True


def import_stream(client: Client, chunks: Iterator[bytes], repository: str, tag: str, changes: list[str]) -> str:
    """`docker import` of a root filesystem tar stream as `repository:tag`; the new image's ID."""
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        client.api.import_image(src=chunks, repository=repository, tag=tag, changes=changes)
    except docker.errors.APIError as exc:
        raise InfraError(f"docker engine: import as {repository}:{tag}: {exc}") from None
    found = image_id(client, f"{repository}:{tag}")
    if found is None:
        raise InfraError(f"docker engine: import as {repository}:{tag} made no image")
    return found


def import_file(client: Client, path: Path, repository: str, tag: str) -> str:
    """`docker import` of a root filesystem tar file as `repository:tag`; the new image's ID."""
    with open(path, "rb") as src:
        return import_stream(client, iter(lambda: src.read(1 << 20), b""), repository, tag, [])


def push(client: Client, repository: str, tag: str,
         auth: tuple[str, str] | dict[str, str] | None) -> Iterator[dict[str, Any]]:
    """The engine's push stream of `repository:tag` (decoded items; errors arrive as `error` items); `auth` is a
    (username, password) pair or the registry keychain's auth_config of that host."""
    auth_config = auth if isinstance(auth, dict) else {"username": auth[0], "password": auth[1]} if auth else None
    items: Iterator[dict[str, Any]] = client.api.push(repository, tag=tag, stream=True, decode=True,
                                                     auth_config=auth_config)
    return items


def pull_by_digest(client: Client, ref: str, auth: dict[str, str] | None = None) -> bool:
    """Pull `repository@sha256:...` (the engine checks the content against the digest) with `auth`, the registry
    keychain's auth_config of its host; False when `ref` names no digest or the registry does not serve it."""
    import docker  # lazy: docker SDK, slow to import; start-up

    image = ImageRef(ref)
    if not image.digest:
        return False
    try:
        client.api.pull(image.name, tag=image.digest, auth_config=auth)
    except docker.errors.APIError:
        return False
    return inspect_image(client, ref) is not None


def tag(client: Client, image_id: str, ref: str) -> bool:
    """Point the tag `ref` at `image_id`; False when the engine refused."""
    image = ImageRef(ref)
    return bool(client.api.tag(image_id, image.name, image.tag, force=True))


def tag_image(client: Client, image_id: str, ref: str) -> None:
    if not tag(client, image_id, ref):
        raise BuildFailed(f"{ref}: the engine refused to tag {image_id}")


def read_file(client: Client, image_id: str, path: str) -> bytes | None:
    """One file of an image, through a created (never started) container; None when absent."""

    import docker  # lazy: docker SDK, slow to import; start-up

    container = client.containers.create(image_id, command=["true"], network_mode="none", labels=owner_labels())
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            return bytes(member.read()) if member else None
    except docker.errors.NotFound:
        return None
    finally:
        container.remove(force=True)


def remove_image(client: Client, ref: str, force: bool = False) -> bool:
    """Remove a tag (or image; `force`: an image and every tag on it); True when something was removed."""
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        client.api.remove_image(ref, noprune=False, force=force)
        return True
    except docker.errors.ImageNotFound:
        return False


def remove_unused(client: Client, image: str) -> bool:
    """Remove an untagged image no container or child image uses; False when it is gone, named or still used."""
    attrs = inspect_image(client, image)
    return attrs is not None and not attrs.get("RepoTags") and untag(client, image)


def untag(client: Client, tag: str) -> bool:
    """Remove one reference (a tag, or an untagged image by ID) without pruning its parents, leaving the
    layer cache under it to the engine's prune; one a container or child still uses, or gone, is left: False."""
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        client.api.remove_image(tag, noprune=True)
        return True
    except (docker.errors.ImageNotFound, docker.errors.APIError):
        return False


class _Progress:
    """Follows the classic builder's stream: steps, cache hits, per-step timings, the log file."""

    def __init__(self, log_file: IO[str], echo: bool, quiet: log.Progress | None = None,
                 records: tuple[str, ...] = ()):
        self.log_file, self.echo = log_file, echo
        self.records = records  # lines starting with one of these are records: the log file's, never the console's
        self.quiet = quiet  # not echoing: a progress line at most every so often (builder/core/log.py)
        self.steps: list[Step] = []
        self.tail: list[str] = []
        self.started = time.monotonic()
        self.step_started = self.started
        self.image_id = ""
        self.error = ""
        self.partial = ""  # the engine may split one long output line over several stream chunks

    def line(self, text: str) -> None:
        self.log_file.write(text + "\n")
        self.log_file.flush()
        record = next((r for r in self.records if text.startswith(r)), None)
        shown = f"{record.strip()} record ({len(text)} bytes): in the build log" if record else text
        if self.echo:
            print(shown, file=sys.stderr, flush=True)
        self.tail = (self.tail + [shown])[-20:]
        if self.quiet:
            self.quiet.feed(shown)
        match = STEP_RX.match(text)
        now = time.monotonic()
        if match:
            self._close(now)
            self.steps.append(Step(int(match[1]), int(match[2]), match[3]))
            self.step_started = now
            if self.quiet:
                self.quiet.stage, self.quiet.count = f"step {match[1]}/{match[2]}", ""
        elif self.steps:
            self.steps[-1].lines.append(text)
            if text.strip() == "---> Using cache":
                self.steps[-1].cached = True
            layer = LAYER_RX.match(text.strip())
            if layer:
                self.steps[-1].image = layer[1]

    def _close(self, now: float) -> None:
        if self.steps and not self.steps[-1].seconds:
            self.steps[-1].seconds = round(now - self.step_started, 3)

    def chunk(self, chunk: dict[str, Any]) -> None:
        if "stream" in chunk:
            lines = (self.partial + chunk["stream"]).split("\n")
            self.partial = lines.pop()
            for text in lines:
                if text.strip():
                    self.line(text.rstrip())
        if "aux" in chunk and isinstance(chunk["aux"], dict) and chunk["aux"].get("ID"):
            self.image_id = chunk["aux"]["ID"]
        if "errorDetail" in chunk or "error" in chunk:
            detail = chunk.get("errorDetail") or {}
            self.error = str(detail.get("message") or chunk.get("error") or "build error")
            self.line(f"ERROR: {self.error}")

    def finish(self) -> None:
        if self.partial.strip():
            self.line(self.partial.rstrip())
        self.partial = ""
        self._close(time.monotonic())


SCRIPT_ERROR = "builder: "  # the one-line error an in-image script prints before failing a step
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def build(client: Client, context_fileobj: IO[bytes], tag: str, log_path: Path, nocache: bool = False,
          echo: bool = True, buildargs: dict[str, str] | None = None, every: float = log.EVERY_S,
          records: tuple[str, ...] = ()) -> BuildResult:
    """Build a custom context tar; stream each line to stderr (echo) or a progress line at most every `every`
    seconds, and every line to log_path (a line starting with one of `records`, a machine record such as the
    build's BUILD-ENV, goes to log_path only: the console gets one line saying so); BuildFailed names the failing
    step (its instruction) and the log, with the last 20 lines as details. The tag is set only on success."""
    before = inspect_image(client, tag)
    log_path = Path(log_path)
    with open(log_path, "w") as log_file:
        progress = _Progress(log_file, echo, None if echo else log.Progress(f"build {tag}", log_path, every), records)
        try:
            stream = client.api.build(fileobj=context_fileobj, custom_context=True, tag=tag, rm=True,
                                      forcerm=True, pull=False, nocache=nocache, network_mode="none",
                                      buildargs=buildargs or None, decode=True)
            for chunk in stream:
                progress.chunk(chunk)
        except Exception as exc:  # refused by the engine (parse error) or the engine went away
            if unreachable(exc):
                progress.line(f"ERROR: engine unreachable: {exc}")
                raise InfraError(f"docker engine: connection lost during the build of {tag}; log {log_path}") from None
            progress.line(f"ERROR: {type(exc).__name__}: {exc}")
            progress.error = progress.error or f"{type(exc).__name__}: {str(exc)[:300]}"
        progress.finish()
        for step in progress.steps:
            log_file.write(f"# step {step.index}/{step.total} {step.seconds:.2f} s"
                           f"{' cached' if step.cached else ''}: {step.instruction}\n")
    seconds = round(time.monotonic() - progress.started, 3)
    if progress.error or not progress.image_id:
        _drop_partial_tag(client, tag, before)
        failing = progress.steps[-1] if progress.steps else None
        instruction = failing.instruction if failing else ""
        shown = instruction if len(instruction) <= 60 else instruction[:57] + "..."  # the reason must fit the line
        where = f"step {failing.index}/{failing.total} `{shown}`" if failing else "before the first step"
        plain = [ANSI.sub("", ln) for ln in (failing.lines if failing else [])]  # stderr comes coloured
        said = [ln for ln in plain if ln.startswith(SCRIPT_ERROR)]  # an image script's one line
        reason = said[-1] if said else progress.error
        reason = re.sub(r"^The command '.*' returned a non-zero code: (\d+)$", r"the step exited \1", reason or "")
        failed = BuildFailed(f"docker build {tag}: failed at {where}; log {log_path}: {reason[:300] or 'no image produced'}",
                             details=[f"step: {instruction}", *progress.tail] if failing else progress.tail)
        failed.steps = tuple(progress.steps)
        raise failed
    return BuildResult(progress.image_id, progress.steps, seconds, str(log_path))


def unreachable(exc: BaseException) -> bool:
    """A connection failure to the engine or a registry (requests/urllib3 raise OSError subclasses)."""
    return isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError))


def _drop_partial_tag(client: Client, tag: str, before: dict[str, Any] | None) -> None:
    """The classic builder tags only on success; remove the tag anyway if it moved during a failed build."""
    after = inspect_image(client, tag)
    if after and (before is None or after["Id"] != before["Id"]):
        remove_image(client, tag)
