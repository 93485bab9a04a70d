"""One short command in a fresh container of an image: network none, given files copied in before it starts,
stdout and stderr back, the container always removed (also on timeout and Ctrl-C). `builder replay` uses it."""
from __future__ import annotations

import io
import tarfile
import time
from dataclasses import dataclass
from typing import Any

from builder.core.errors import BadInput, InfraError
from builder.engine.client import Client, owner_labels


@dataclass
class Done:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    network: str | None


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def run(client: Client, image: str, command: list[str], files: dict[str, bytes], env: dict[str, str],
        tmpfs: dict[str, str], labels: dict[str, str], timeout_s: int) -> Done:
    """Create, copy `files` in (absolute paths outside the tmpfs mounts), start, wait, read the logs, remove."""
    import docker  # lazy: docker SDK, slow to import; start-up
    import requests  # lazy: slow to import; start-up

    start = time.monotonic()
    container: Any = None
    try:
        try:
            container = client.containers.create(image, command=command, environment=env, network_mode="none",
                                                 tmpfs=tmpfs, working_dir="/tmp", labels={**labels, **owner_labels()},
                                                 detach=True)
        except docker.errors.ImageNotFound:
            raise BadInput(f"--image {image}: not found in the Docker engine") from None
        except docker.errors.APIError as err:
            raise InfraError(f"docker engine: cannot create a container of {image}: {err}") from None
        if files and not container.put_archive("/", _tar(files)):
            raise InfraError(f"docker engine: cannot copy the replay files into the container of {image}")
        container.start()
        timed_out = False
        try:
            container.wait(timeout=timeout_s)
        except (requests.exceptions.RequestException, ConnectionError):
            timed_out = True
            container.kill()
        container.reload()
        state = container.attrs.get("State", {})
        return Done(exit_code=state.get("ExitCode"), timed_out=timed_out,
                    stdout=container.logs(stdout=True, stderr=False).decode("utf-8", "replace"),
                    stderr=container.logs(stdout=False, stderr=True).decode("utf-8", "replace"),
                    seconds=round(time.monotonic() - start, 3),
                    network=container.attrs.get("HostConfig", {}).get("NetworkMode"))
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
