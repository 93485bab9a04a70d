"""The Docker engine, through the SDK's low-level API: connect, build a context tar, inspect/tag/remove.

Orchestration (which context, which tag, records) lives in builder/image/build.py.
Every build runs with network_mode "none", pull=False, and intermediate containers removed.
"""
from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import requests

from builder.core.errors import BuildFailed, InfraError
from builder.core.options import Settings

STEP_RX = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
LAYER_RX = re.compile(r"^---> ([0-9a-f]{12})$")
Client = Any  # docker.DockerClient (the SDK ships no type hints)


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
    import docker

    try:
        client = docker.from_env(timeout=int(timeout or settings.build_timeout_s),
                                 environment=settings.docker_environment(),
                                 use_ssh_client=(settings.docker_host or "").startswith("ssh://"))
        client.ping()
        return client
    except Exception as exc:  # DockerException, requests errors, socket errors
        where = f"docker engine {settings.docker_host}" if settings.docker_host else "docker engine"
        raise InfraError(f"{where}: not reachable ({type(exc).__name__}: {str(exc)[:200]});"
                         " start it with `builder setup`") from None


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
    import docker

    try:
        attrs: dict[str, Any] = client.api.inspect_image(ref)
        return attrs
    except docker.errors.ImageNotFound:
        return None


def tag_image(client: Client, image_id: str, ref: str) -> None:
    repository, _, tag = ref.rpartition(":")
    if not client.api.tag(image_id, repository, tag, force=True):
        raise BuildFailed(f"{ref}: the engine refused to tag {image_id}")


def read_file(client: Client, image_id: str, path: str) -> bytes | None:
    """One file of an image, through a created (never started) container; None when absent."""
    import io
    import tarfile

    import docker

    container = client.containers.create(image_id, command=["true"], network_mode="none")
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            return bytes(member.read()) if member else None
    except docker.errors.NotFound:
        return None
    finally:
        container.remove(force=True)


def remove_image(client: Client, ref: str) -> bool:
    """Remove a tag (or image); True when something was removed."""
    import docker

    try:
        client.api.remove_image(ref, noprune=False)
        return True
    except docker.errors.ImageNotFound:
        return False


class _Progress:
    """Follows the classic builder's stream: steps, cache hits, per-step timings, the log file."""

    def __init__(self, log_file: IO[str], echo: bool):
        self.log_file, self.echo = log_file, echo
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
        if self.echo:
            print(text, file=sys.stderr, flush=True)
        self.tail = (self.tail + [text])[-20:]
        match = STEP_RX.match(text)
        now = time.monotonic()
        if match:
            self._close(now)
            self.steps.append(Step(int(match[1]), int(match[2]), match[3]))
            self.step_started = now
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
          echo: bool = True) -> BuildResult:
    """Build a custom context tar; stream each line to stderr and log_path; BuildFailed names the
    failing step (its instruction) and the log, with the last 20 lines as details. The tag is set only on success."""
    before = inspect_image(client, tag)
    log_path = Path(log_path)
    with open(log_path, "w") as log_file:
        progress = _Progress(log_file, echo)
        try:
            stream = client.api.build(fileobj=context_fileobj, custom_context=True, tag=tag, rm=True,
                                      forcerm=True, pull=False, nocache=nocache, network_mode="none",
                                      decode=True)
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
        where = f"step {failing.index}/{failing.total} `{failing.instruction}`" if failing else "before the first step"
        plain = [ANSI.sub("", ln) for ln in (failing.lines if failing else [])]  # stderr comes coloured
        said = [ln for ln in plain if ln.startswith(SCRIPT_ERROR)]  # an image script's one line
        reason = said[-1] if said else progress.error
        raise BuildFailed(f"docker build {tag}: failed at {where}: {reason[:300] or 'no image produced'};"
                          f" log {log_path}", details=progress.tail)
    return BuildResult(progress.image_id, progress.steps, seconds, str(log_path))


def unreachable(exc: BaseException) -> bool:
    """A connection failure to the engine or a registry (requests/urllib3 raise OSError subclasses)."""
    return isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError))


def _drop_partial_tag(client: Client, tag: str, before: dict[str, Any] | None) -> None:
    """The classic builder tags only on success; remove the tag anyway if it moved during a failed build."""
    after = inspect_image(client, tag)
    if after and (before is None or after["Id"] != before["Id"]):
        remove_image(client, tag)
