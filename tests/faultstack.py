"""The parts the fault matrix (tests/integration/test_fault_matrix.py) breaks on purpose, all of its own: never the shared
engine or registry.

- `Engine`: a second dockerd (own --data-root, --exec-root, pidfile, unix socket; --bridge=none --iptables=false
  --ip-masq=false) that can be stopped and started again with its data kept.
- `Registry`: Debian's docker-registry on a free 127.0.0.1 port, stoppable and restartable (same storage).
- `FaultProxy`: a TCP relay on 127.0.0.1 in front of it, the address every client uses. Modes: `pass`,
  `500` (every request answered 500), `truncate` (each response cut at half its body, or half its headers
  when it has no body, then the connection closed). Changing the mode drops the open connections.
- `LoopDisk`: a small ext4 file system on a loop device for the cache and the run directories; `fill()`
  takes every free block (fallocate), `drain()` gives them back.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

from tests.fixture_types import DockerClient

REGISTRY_BIN = "/usr/bin/docker-registry"
MANIFEST_TYPES = ("application/vnd.docker.distribution.manifest.v2+json",
                  "application/vnd.oci.image.manifest.v1+json")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not come up in {timeout:.0f} s")


class Engine:
    def __init__(self, root: Path):
        self.root = root
        self.sock = root / "docker.sock"
        self.url = f"unix://{self.sock}"
        self.proc: subprocess.Popen[bytes] | None = None
        (root / "daemon.json").write_text(json.dumps({"deprecated-key-path": f"{root}/key.json"}))

    def client(self) -> DockerClient:
        import docker

        return docker.DockerClient(base_url=self.url, timeout=120)

    def up(self) -> bool:
        with socket.socket(socket.AF_UNIX) as probe:  # the SDK leaves a refused socket to the GC (a warning)
            try:
                probe.connect(str(self.sock))
            except OSError:
                return False
        client = self.client()
        try:
            return bool(client.ping())
        except Exception:
            return False
        finally:
            client.close()

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        cmd = [shutil.which("dockerd") or "dockerd", f"--data-root={self.root}/data", f"--exec-root={self.root}/exec",
               f"--pidfile={self.root}/docker.pid", f"--host={self.url}", "--bridge=none", "--iptables=false",
               "--ip-masq=false", f"--config-file={self.root}/daemon.json"]
        with open(self.root / "dockerd.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self.up, "the fault-matrix dockerd", 90)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def containers(self) -> list[str]:
        client = self.client()
        try:
            return [c.name for c in client.containers.list(all=True)]
        finally:
            client.close()

    def close(self) -> None:
        client = self.client()
        with contextlib.suppress(Exception):
            for container in client.containers.list(all=True):
                container.remove(force=True)
        client.close()
        self.stop()
        with open("/proc/self/mounts") as fh:
            points = [line.split()[1] for line in fh if line.split()[1].startswith(str(self.root) + "/")]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)


class Registry:
    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        storage = {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True},
                   "maintenance": {"uploadpurging": {"enabled": False}}}
        config = {"version": 0.1, "log": {"level": "warn"}, "storage": storage,
                  "http": {"addr": f"127.0.0.1:{self.port}"}}
        (root / "registry.yml").write_text(json.dumps(config))

    def up(self) -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{self.port}/v2/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        with open(self.root / "registry.log", "ab") as log:
            self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(self.root / "registry.yml")], stdout=log,
                                         stderr=subprocess.STDOUT)
        wait_for(self.up, "the fault-matrix registry", 30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


class FaultProxy:
    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.mode = "pass"
        self.conns: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.host = f"127.0.0.1:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def set_mode(self, mode: str) -> None:
        with self.lock:
            self.mode = mode
            conns, self.conns = list(self.conns), set()
        for conn in conns:  # in-flight requests meet the new mode on their next connection
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        self.set_mode("pass")
        self.server.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _track(self, *socks: socket.socket) -> None:
        with self.lock:
            self.conns.update(socks)

    def _handle(self, client: socket.socket) -> None:
        mode = self.mode
        try:
            if mode == "500":
                _read_head(client)
                client.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=30)
            except OSError:
                return  # the registry is down: the client sees the connection closed
            self._track(client, upstream)
            if mode == "truncate":
                self._truncate(client, upstream)
            else:
                pump = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
                pump.start()
                _pump(client, upstream)
                pump.join(timeout=600)
        finally:
            with contextlib.suppress(OSError):
                client.close()

    def _truncate(self, client: socket.socket, upstream: socket.socket) -> None:
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        head = _read_head(upstream)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length" and value.strip().isdigit():
                length = int(value)
        if length == 0:
            client.sendall(head[: max(1, len(head) // 2)])
        else:
            client.sendall(head)
            _copy_exactly(upstream, client, length // 2)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        upstream.close()


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _copy_exactly(src: socket.socket, dst: socket.socket, count: int) -> None:
    while count > 0:
        chunk = src.recv(min(65536, count))
        if not chunk:
            return
        dst.sendall(chunk)
        count -= len(chunk)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            chunk = src.recv(1 << 16)
            if not chunk:
                break
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class LoopDisk:
    def __init__(self, root: Path, size: str):
        self.image = root / "disk.img"
        self.mount = root / "disk"
        self.mount.mkdir()
        subprocess.run(["truncate", "-s", size, str(self.image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)], check=True)
        # discard: a file deleted inside gives its blocks back to the host (the image file stays as small as
        # what it holds; without it, every export cell's tree and .sqsh grew the image towards its full size)
        subprocess.run(["mount", "-o", "loop,discard", str(self.image), str(self.mount)], check=True)
        self.filler = self.mount / "filler"

    def fill(self) -> None:
        """Take every free block (and leave a few inodes: creating an empty file still works, writing does not)."""
        free = os.statvfs(self.mount)
        size = max(0, free.f_bavail * free.f_frsize - (32 << 20))
        subprocess.run(["fallocate", "-l", str(size), str(self.filler)], check=False, capture_output=True)
        for i, chunk in enumerate((1 << 20, 1 << 16, 1 << 12, 1 << 9)):  # what fallocate left, down to the last block
            with contextlib.suppress(OSError), open(self.mount / f"filler-{i}", "wb", buffering=0) as fh:
                while True:
                    fh.write(b"\0" * chunk)
                    os.fsync(fh.fileno())

    def drain(self) -> None:
        self.filler.unlink(missing_ok=True)
        for path in self.mount.glob("filler-*"):
            path.unlink()

    def close(self) -> None:
        self.drain()
        subprocess.run(["umount", "-l", str(self.mount)], check=False, capture_output=True)


def copy_image(src_host: str, src_name: str, digest: str, dst_host: str, dst_name: str, work: Path) -> None:
    """Copy one image manifest and its blobs between registries through the HTTP API (streamed)."""
    accept = {"Accept": ", ".join(MANIFEST_TYPES)}
    got = requests.get(f"http://{src_host}/v2/{src_name}/manifests/{digest}", headers=accept, timeout=60)
    got.raise_for_status()
    doc = got.json()
    for desc in [*doc["layers"], doc["config"]]:
        blob = desc["digest"]
        if requests.head(f"http://{dst_host}/v2/{dst_name}/blobs/{blob}", timeout=60).status_code == 200:
            continue
        path = work / blob.replace(":", "_")
        with requests.get(f"http://{src_host}/v2/{src_name}/blobs/{blob}", stream=True, timeout=600) as resp:
            resp.raise_for_status()
            with open(path, "wb") as fh:
                shutil.copyfileobj(resp.raw, fh, 1 << 20)
        start = requests.post(f"http://{dst_host}/v2/{dst_name}/blobs/uploads/", timeout=60)
        location = start.headers["Location"]
        url = location if location.startswith("http") else f"http://{dst_host}{location}"
        with open(path, "rb") as fh:
            put = requests.put(url, params={"digest": blob}, data=fh, timeout=600,
                               headers={"Content-Type": "application/octet-stream"})
        put.raise_for_status()
        path.unlink()
    requests.put(f"http://{dst_host}/v2/{dst_name}/manifests/{digest}", data=got.content, timeout=60,
                 headers={"Content-Type": got.headers["Content-Type"]}).raise_for_status()
