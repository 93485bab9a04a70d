"""A CONNECT proxy from a network namespace of its own to this host's network (benchmarks/fresh_demo.sh only).

    python benchmarks/netns_proxy.py PORT /proc/<pid>/ns/net

Started inside the fresh run's namespace: it listens on that namespace's 127.0.0.1:PORT, then moves itself into
the given namespace (setns), so the tunnels it opens leave through the host's network. pip's index downloads take
it (HTTPS_PROXY); the engine, the registry and the builds never see it.
"""
from __future__ import annotations

import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client: socket.socket) -> None:
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        chunk = client.recv(4096)
        if not chunk:
            client.close()
            return
        head += chunk
    words = head.split(b"\r\n", 1)[0].split()
    if len(words) < 2 or words[0] != b"CONNECT":
        client.sendall(b"HTTP/1.1 405 CONNECT only\r\n\r\n")
        client.close()
        return
    host, _, port = words[1].decode().rpartition(":")
    try:
        upstream = socket.create_connection((host, int(port)), timeout=30)
    except OSError:
        client.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
        client.close()
        return
    upstream.settimeout(None)
    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
    pump(client, upstream)


def main() -> int:
    port, netns = int(sys.argv[1]), sys.argv[2]
    listener = socket.create_server(("127.0.0.1", port))
    fd = os.open(netns, os.O_RDONLY)
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"setns {netns}")
    print("ready", flush=True)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve, args=(client,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
