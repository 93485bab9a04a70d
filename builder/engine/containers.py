"""Containers through the engine door: a spec of plain values in, an outcome of plain values out.

Only builder/engine/ talks to the Docker SDK; this module owns a container's whole life (create, start,
wait with a timeout, kill, logs, facts, remove) and maps the SDK's and HTTP errors to the one hierarchy:
a refusal or a lost engine is InfraError (exit 3). The container is always removed, also on Ctrl-C.
"""
from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import InfraError
from builder.engine.client import Client, owner_labels


@dataclass(frozen=True)
class Bind:
    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class Volume:
    """A named volume mounted at `target` (a census container's tmpfs volume, shared with its gate)."""

    name: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """One container: always network none; `tmpfs` maps a path to its mount options. A container started beside
    another (run's `beside`) joins its pid namespace."""

    image: str
    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    tmpfs: dict[str, str] = field(default_factory=dict)
    binds: list[Bind] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    working_dir: str = "/tmp"
    gpus: int = 0
    files: dict[str, bytes] = field(default_factory=dict)  # absolute path -> bytes, copied in before the start
    volumes: list[Volume] = field(default_factory=list)
    cap_add: list[str] = field(default_factory=list)
    cap_drop: list[str] = field(default_factory=list)
    read_only: bool = False

    def sdk_kwargs(self) -> dict[str, Any]:
        """The SDK's `containers.create` arguments for this spec."""
        import docker  # lazy: docker SDK, slow to import; start-up

        kwargs: dict[str, Any] = {
            "image": self.image, "command": list(self.command), "environment": dict(self.environment),
            "network_mode": "none", "tmpfs": dict(self.tmpfs), "working_dir": self.working_dir, "detach": True,
            "mounts": [docker.types.Mount(target=b.target, source=b.source, type="bind", read_only=b.read_only)
                       for b in self.binds] + [docker.types.Mount(target=v.target, source=v.name, type="volume",
                                                                  read_only=v.read_only) for v in self.volumes],
            "labels": {**self.labels, **owner_labels()}}
        if self.cap_add or self.cap_drop or self.read_only:
            kwargs.update(cap_add=list(self.cap_add), cap_drop=list(self.cap_drop), read_only=self.read_only,
                          security_opt=["no-new-privileges"])
        if self.gpus > 0:
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=self.gpus, capabilities=[["gpu"]])]
        return kwargs


@dataclass
class Outcome:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    facts: dict[str, Any]


def facts(attrs: dict[str, Any]) -> dict[str, Any]:
    """What the engine says the container was: its isolation (network, mounts, tmpfs, devices) and its end."""
    state, host = attrs.get("State", {}), attrs.get("HostConfig", {})
    return {"id": attrs.get("Id"), "name": attrs.get("Name", "").lstrip("/"), "image": attrs.get("Image"),
            "network": host.get("NetworkMode"),
            "networks": sorted((attrs.get("NetworkSettings", {}).get("Networks") or {}).keys()),
            "mounts": [{"source": m.get("Source"), "target": m.get("Destination"), "rw": m.get("RW")}
                       for m in attrs.get("Mounts") or []],
            "tmpfs": host.get("Tmpfs") or {}, "env": attrs.get("Config", {}).get("Env") or [],
            "device_requests": host.get("DeviceRequests") or [],
            "started": state.get("StartedAt"), "finished": state.get("FinishedAt"),
            "exit_code": state.get("ExitCode"), "oom_killed": state.get("OOMKilled")}


def run(client: Client, spec: ContainerSpec, timeout_s: int, what: str, beside: ContainerSpec | None = None) -> Outcome:
    """Run one fresh container to its end (killed at `timeout_s`), return its output and facts, remove it.
    `beside`: a container started after it in its pid namespace (the census container), ended with it (its pid
    namespace's first process ends), its facts under `beside`; one that cannot start is a fact, not an error."""
    import docker  # lazy: docker SDK, slow to import; start-up
    import requests  # lazy: slow to import; start-up

    container = None
    side: dict[str, Any] = {}
    try:
        try:
            container = client.containers.create(**spec.sdk_kwargs())
            if spec.files and not container.put_archive("/", _tar(spec.files)):
                raise InfraError(f"docker engine: cannot copy files into the {what} container")
            container.start()
        except (docker.errors.APIError, requests.exceptions.RequestException, ConnectionError) as err:
            raise InfraError(f"docker engine: cannot start the {what} container: {err}") from None
        if beside is not None:
            side = _start_beside(client, beside, container.id)
        timed_out = False
        try:
            container.wait(timeout=timeout_s)
        except (requests.exceptions.RequestException, ConnectionError):
            timed_out = True
            try:
                container.kill()
                container.wait(timeout=60)
            except docker.errors.APIError:
                pass  # it stopped on its own meanwhile
        try:
            container.reload()
            stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
        except (docker.errors.APIError, requests.exceptions.RequestException, ConnectionError) as err:
            raise InfraError(f"docker engine: lost the {what} container: {err}") from None
        seen = facts(container.attrs)
        if timed_out:
            seen["timed_out"] = True
        if side.get("id"):
            side.update(_ended(client, side["id"]))
        if side:
            seen["beside"] = side
        return Outcome(seen.get("exit_code"), stdout, stderr, timed_out, seen)
    finally:
        if side.get("id"):
            remove(client, side["id"])
        if container is not None:
            remove(client, container.id)


def engine_errors() -> tuple[type[BaseException], ...]:
    """What a call to the engine raises when the engine refuses it or cannot be reached (NotFound among them)."""
    import docker  # lazy: docker SDK, slow to import; start-up
    import requests  # lazy: slow to import; start-up

    return docker.errors.APIError, requests.exceptions.RequestException, ConnectionError


def _start_beside(client: Client, spec: ContainerSpec, target: str) -> dict[str, Any]:
    """Start `spec` in `target`'s pid namespace: {id, caps} or {error}."""
    try:
        side = client.containers.create(**spec.sdk_kwargs(), pid_mode=f"container:{target}")
    except engine_errors() as err:
        return {"error": f"cannot create: {err}"}
    try:
        side.start()
    except engine_errors() as err:
        return {"id": side.id, "error": f"cannot start: {err}"}
    return {"id": side.id, "cap_add": list(spec.cap_add), "cap_drop": list(spec.cap_drop), "read_only": spec.read_only}


def _ended(client: Client, container_id: str) -> dict[str, Any]:
    """A beside container's end: its exit code and the tail of its stderr (it ends with its pid namespace)."""
    try:
        client.api.wait(container_id, timeout=30)
        state = client.api.inspect_container(container_id).get("State", {})
        err = client.api.logs(container_id, stdout=False, stderr=True).decode("utf-8", "replace")
    except engine_errors() as failed:
        return {"end": f"unknown: {failed}"}
    return {"exit_code": state.get("ExitCode"), "stderr_tail": err[-1000:]}


def tmpfs_volume(client: Client, name: str, labels: dict[str, str]) -> str:
    """A named volume on tmpfs (nothing on the engine's disk), for containers that share files; its name."""
    try:
        client.api.create_volume(name, driver="local", driver_opts={"type": "tmpfs", "device": "tmpfs",
                                                                     "o": "size=64m,mode=0755"},
                                 labels={**labels, **owner_labels()})
    except engine_errors() as err:
        raise InfraError(f"docker engine: cannot create volume {name}: {err}") from None
    return name


def remove_volume(client: Client, name: str) -> None:
    """Remove a volume; one already gone (or an engine gone) is left to the orphan sweep."""
    try:
        client.api.remove_volume(name, force=True)
    except engine_errors():
        pass


def labelled_volumes(client: Client, label: str) -> list[str]:
    """Names of the volumes that carry `label` (`key` or `key=value`)."""
    found = client.api.volumes(filters={"label": label}) or {}
    return [str(v["Name"]) for v in found.get("Volumes") or []]


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def remove(client: Client, container_id: str) -> None:
    """Force-remove a container; one already gone (or an engine gone) is left to the orphan sweep."""
    try:
        client.api.remove_container(container_id, force=True)
    except engine_errors():
        pass


def labelled(client: Client, label: str) -> list[str]:
    """IDs of the containers (running or not) that carry `label` (`key` or `key=value`)."""
    return [str(c["Id"]) for c in client.api.containers(all=True, filters={"label": label})]


def create_stopped(client: Client, image: str) -> str:
    """A created, never started, network-none container of `image` (to read files from); its ID."""
    created = client.api.create_container(image, command=["true"], network_disabled=True, labels=owner_labels())
    return str(created["Id"])


def archive(client: Client, container_id: str, path: str) -> Iterator[bytes] | None:
    """The tar stream of `path` in a container, or None when the path is absent."""
    import docker  # lazy: docker SDK, slow to import; start-up

    try:
        stream, _ = client.api.get_archive(container_id, path)
    except docker.errors.NotFound:
        return None
    chunks: Iterator[bytes] = stream
    return chunks
