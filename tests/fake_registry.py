"""An in-process registry and token service for the registry client's unit tests (no Docker): blobs and
manifests in memory, Basic or the distribution token flow, and a record of every request's Authorization."""
from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class World:
    """What the fake serves and what it saw."""
    auth: str = "none"  # none | basic | bearer
    user: tuple[str, str] = ("ci", "s3cret-pass")
    refresh: str = ""  # an identity token the token service accepts by POST
    post_refused: bool = False  # the token service answers POST with 405 (Harbor)
    grant: str = "pull,push,delete"  # the actions the token service grants
    token_life: int = 300
    delete_refused: bool = False
    tokens: dict[str, tuple[set[str], float]] = field(default_factory=dict)  # token -> (scopes granted, expires)
    blobs: dict[str, bytes] = field(default_factory=dict)  # "<repo>@<digest>" -> bytes
    uploads: dict[str, str] = field(default_factory=dict)  # id -> repo
    manifests: dict[str, bytes] = field(default_factory=dict)
    seen: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, Authorization)
    token_calls: list[tuple[str, str]] = field(default_factory=list)  # (method, scope)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _needed(method: str, path: str, query: dict[str, list[str]]) -> list[str]:
    parts = path.split("/")
    if len(parts) < 4 or parts[1] != "v2":
        return []
    kinds = ("manifests", "blobs", "tags")
    at = next(i for i, p in enumerate(parts) if p in kinds)
    repo = "/".join(parts[2:at])
    action = "pull" if method in ("GET", "HEAD") else "delete" if method == "DELETE" else "push"
    need = [f"repository:{repo}:{action}"]
    if "from" in query:
        need.append(f"repository:{query['from'][0]}:pull")
    return need


def handler(world: World, realm: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _token(self) -> None:
            parts = urlsplit(self.path)
            if self.command == "POST":
                form = parse_qs(self._body().decode())
                if world.post_refused:
                    world.token_calls.append(("POST", form.get("scope", [""])[0]))
                    return self._reply(405)
                ok = form.get("refresh_token", [""])[0] == world.refresh and bool(world.refresh)
                scope = form.get("scope", [""])[0]
            else:
                form = parse_qs(parts.query)
                given = self.headers.get("Authorization", "")
                ok = given == "Basic " + base64.b64encode(":".join(world.user).encode()).decode() or not given
                scope = form.get("scope", [""])[0]
            world.token_calls.append((self.command, scope))
            if not ok:
                return self._reply(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
            granted = set()
            for s in scope.split():
                kind, repo, actions = s.split(":")
                granted |= {f"{kind}:{repo}:{a}" for a in actions.split(",") if a in world.grant.split(",")}
            token = uuid.uuid4().hex
            world.tokens[token] = (granted, time.time() + world.token_life)
            self._reply(200, json.dumps({"token": token, "expires_in": world.token_life}).encode())

        def _allowed(self, query: dict[str, list[str]]) -> bool:
            given = self.headers.get("Authorization", "")
            if world.auth == "none":
                return True
            if world.auth == "basic":
                return given == "Basic " + base64.b64encode(":".join(world.user).encode()).decode()
            need = _needed(self.command, urlsplit(self.path).path, query)
            if not given.startswith("Bearer "):
                return False
            granted, expires = world.tokens.get(given[7:], (set(), 0.0))
            return time.time() < expires and all(n in granted for n in need)

        def _handle(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/token":
                return self._token()
            query = parse_qs(parts.query)
            with world.lock:
                world.seen.append((self.command, parts.path, self.headers.get("Authorization", "")))
            if not self._allowed(query):
                body = self._body() if self.command in ("PUT", "POST") else b""
                del body
                challenge = ('Basic realm="fake"' if world.auth == "basic" else
                             f'Bearer realm="{realm}",scope="{" ".join(_needed(self.command, parts.path, query))}"')
                return self._reply(401, b"{}", {"WWW-Authenticate": challenge})
            return self._serve(parts.path, query)

        def _serve(self, path: str, query: dict[str, list[str]]) -> None:
            if path == "/v2/":
                return self._reply(200, b"{}")
            if "/blobs/uploads/" in path:
                repo = path[4:path.index("/blobs/uploads/")]
                if self.command == "POST":
                    self._body()
                    if "mount" in query:
                        key = f"{query['from'][0]}@{query['mount'][0]}"
                        if key in world.blobs:
                            world.blobs[f"{repo}@{query['mount'][0]}"] = world.blobs[key]
                            return self._reply(201)
                    upload = uuid.uuid4().hex
                    world.uploads[upload] = repo
                    return self._reply(202, b"", {"Location": f"/v2/{repo}/blobs/uploads/{upload}"})
                if self.command == "PUT":
                    data, digest = self._body(), query["digest"][0]
                    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                        return self._reply(400, b'{"errors":[{"code":"DIGEST_INVALID"}]}')
                    world.blobs[f"{repo}@{digest}"] = data
                    return self._reply(201, b"", {"Docker-Content-Digest": digest})
                return self._reply(204)
            if "/blobs/" in path:
                repo, digest = path[4:].split("/blobs/")
                blob = world.blobs.get(f"{repo}@{digest}")
                if blob is None:
                    return self._reply(404)
                return self._reply(200, blob, {"Docker-Content-Digest": digest})
            if "/manifests/" in path:
                repo, ref = path[4:].split("/manifests/")
                if self.command == "DELETE":
                    if world.delete_refused:
                        return self._reply(405, b'{"errors":[{"code":"UNSUPPORTED"}]}')
                    return self._reply(202 if world.manifests.pop(f"{repo}:{ref}", None) else 404)
                if self.command == "PUT":
                    body = self._body()
                    digest = "sha256:" + hashlib.sha256(body).hexdigest()
                    world.manifests[f"{repo}:{ref}"] = world.manifests[f"{repo}:{digest}"] = body
                    return self._reply(201, b"", {"Docker-Content-Digest": digest})
                body = world.manifests.get(f"{repo}:{ref}", b"")
                if not body:
                    return self._reply(404)
                return self._reply(200, body, {"Docker-Content-Digest": "sha256:" + hashlib.sha256(body).hexdigest(),
                                                "Content-Type": json.loads(body).get("mediaType", "")})
            return self._reply(404)

        do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _handle

    return Handler


class Fake:
    """A running fake registry (and its token service at /token) on 127.0.0.1; `host` is 127.0.0.1:<port>."""

    def __init__(self, world: World, tls: Any = None) -> None:
        self.world = world
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
        port = self.server.server_address[1]
        self.host = f"127.0.0.1:{port}"
        scheme = "https" if tls else "http"
        self.server.RequestHandlerClass = handler(world, f"{scheme}://{self.host}/token")
        if tls:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
