"""Registry HTTP API v2 operations (go-containerregistry's remote): read back what a registry serves for a tag
and verify it ourselves; write blobs and manifests.

The registry's word (the Docker-Content-Digest header) is never taken alone: the manifest bytes are
hashed here and the config blob is fetched and hashed too. Auth and TLS are the transport's.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import IO, Any
from urllib.parse import urlsplit

import requests

from builder.core import log
from builder.core.errors import InfraError, PublishError
from builder.core.imageref import Repository, digest_of
from builder.core.options import Settings
from builder.engine.registry.keychain import Credential, Keychain, api_host
from builder.engine.registry.transport import TLS, Transport, is_loopback

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
INDEX_TYPES = MANIFEST_TYPES[1], MANIFEST_TYPES[3]


def parse_repository(repository: str) -> Repository:
    """A repository named where it enters (an image's label, a report), as a value: '127.0.0.1:5000/demo/unified'
    -> host '127.0.0.1:5000', path 'demo/unified' (Docker Hub's bare names: path `library/<name>`)."""
    try:
        return repository if isinstance(repository, Repository) else Repository(repository)
    except ValueError:
        raise PublishError(f"image.repository {repository!r}: expected host[:port]/name with an explicit registry "
                           "host") from None


def split_repository(repository: str) -> tuple[str, str]:
    """(host, path) of a repository held as text (tests, tools); builder passes a `Repository` down instead."""
    repo = parse_repository(repository)
    return repo.host, repo.path


def mask(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


class Registry:
    """One registry host; `auth` is (username, password) or None (the keychain's, through from_settings)."""

    def __init__(self, host: str, auth: tuple[str, str] | None = None, scheme: str | None = None,
                 timeout_s: float = 30.0, credential: Credential | None = None, tls: TLS | None = None):
        self.host = host
        self.timeout_s = timeout_s
        cred = credential or (Credential(*auth) if auth else None)
        how = tls or (TLS(scheme="http", verify=False) if is_loopback(host) else TLS())
        if scheme:
            how = TLS(scheme=scheme, verify=how.verify, cert=how.cert, insecure=how.insecure)
        self.transport = Transport(api_host(host), cred, how, timeout_s)
        self.base = self.transport.base
        self.session = self.transport.session
        self.secrets = self.transport.secrets
        self.refused: list[str] = []  # what a DELETE could not remove (405)

    @classmethod
    def from_settings(cls, host: str, settings: Settings) -> Registry:
        """The registry at host with that host's own credentials (keychain), its TLS and the settings' timeout."""
        return cls(host, timeout_s=settings.registry_timeout_s, credential=Keychain(settings).resolve(host),
                   tls=TLS.for_host(api_host(host), settings))

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return self.transport.request(method, path, **kwargs)

    def ping(self) -> None:
        """InfraError when nothing answers /v2/ like a registry."""
        resp = self._request("GET", "/v2/")
        if resp.status_code != 200:
            raise InfraError(f"registry {self.host}: GET /v2/ answered {resp.status_code}, expected 200")

    def manifest(self, name: str, ref: str) -> dict[str, Any]:
        """HEAD then GET /v2/<name>/manifests/<ref>; returns header digest, computed digest, bytes, type."""
        accept = {"Accept": ", ".join(MANIFEST_TYPES)}
        path = f"/v2/{name}/manifests/{ref}"
        head = self._request("HEAD", path, headers=accept)
        if head.status_code != 200:
            raise PublishError(f"registry {self.host}: HEAD {path} answered {head.status_code}, expected 200")
        got = self._request("GET", path, headers=accept)
        if got.status_code != 200:
            raise PublishError(f"registry {self.host}: GET {path} answered {got.status_code}, expected 200")
        return {
            "head_digest": head.headers.get("Docker-Content-Digest", ""),
            "get_digest": got.headers.get("Docker-Content-Digest", ""),
            "computed": digest_of(got.content),
            "content": got.content,
            "media_type": got.headers.get("Content-Type", "").split(";")[0].strip(),
        }

    def tag_digest(self, name: str, tag: str) -> str | None:
        """The digest a tag serves now (HEAD), or None when the tag does not exist."""
        resp = self._request("HEAD", f"/v2/{name}/manifests/{tag}", headers={"Accept": ", ".join(MANIFEST_TYPES)})
        return resp.headers.get("Docker-Content-Digest") if resp.status_code == 200 else None

    def tags(self, name: str) -> list[str]:
        """The tags of a repository (GET /v2/<name>/tags/list); none when it does not exist."""
        resp = self._request("GET", f"/v2/{name}/tags/list")
        return [str(t) for t in (resp.json().get("tags") or [])] if resp.status_code == 200 else []

    def delete_manifest(self, name: str, digest: str) -> bool:
        """DELETE a manifest by digest (every tag on it goes too); True when the registry accepted.
        A registry that refuses deletes (405: GHCR, Docker Hub, or `storage.delete` off) gives one line naming
        what stays, and `refused` keeps it for gc's and prune's answers."""
        status = self._request("DELETE", f"/v2/{name}/manifests/{digest}").status_code
        if status in (405, 501):
            self.refused.append(f"{self.host}/{name}@{digest}")
            log.info(f"registry {self.host}: DELETE refused ({status}): {self.host}/{name}@{digest} could not be "
                     "removed; remove it in the registry's own interface")
        return status == 202

    def blob(self, name: str, digest: str) -> bytes:
        """GET a blob and check its sha256 against the digest asked for."""
        path = f"/v2/{name}/blobs/{digest}"
        resp = self._request("GET", path)
        if resp.status_code != 200:
            raise PublishError(f"registry {self.host}: GET {path} answered {resp.status_code}, expected 200")
        computed = digest_of(resp.content)
        if computed != digest:
            raise PublishError(f"registry {self.host}: blob {digest} has content {computed}")
        return resp.content


    def download_blob(self, name: str, digest: str, out: IO[bytes], chunk: int = 1 << 20) -> int:
        """Stream a blob into `out`, checking its sha256 against the digest; return its size."""
        path = f"/v2/{name}/blobs/{digest}"
        resp = self._request("GET", path, stream=True)
        if resp.status_code != 200:
            raise PublishError(f"registry {self.host}: GET {path} answered {resp.status_code}, expected 200")
        sha, size = hashlib.sha256(), 0
        with resp:
            for data in resp.iter_content(chunk):
                sha.update(data)
                size += len(data)
                out.write(data)
        if digest_of(sha) != digest:
            raise PublishError(f"registry {self.host}: blob {digest} has content {digest_of(sha)}")
        return size

    # ---- writing: blobs by digest (HEAD, cross-repository mount, monolithic upload) and manifests

    def has_blob(self, name: str, digest: str) -> bool:
        return self._request("HEAD", f"/v2/{name}/blobs/{digest}").status_code == 200

    def mount_blob(self, name: str, digest: str, source: str) -> bool:
        """Cross-repository mount (same registry); True when the registry mounted it (201)."""
        resp = self._request("POST", f"/v2/{name}/blobs/uploads/", params={"mount": digest, "from": source})
        if resp.status_code == 202:  # not mounted: an upload session was opened instead; drop it
            location = resp.headers.get("Location", "")
            if location:
                self._request("DELETE", location if location.startswith("/") else _path_of(location))
        return resp.status_code == 201

    def upload_blob(self, name: str, digest: str, path: str,
                    on_session: Callable[[str], None] | None = None) -> None:
        """POST an upload session, then PUT the whole file with its digest; the registry checks the digest.
        `on_session` is told the session's path (as a later DELETE cancels it) before the PUT."""
        start = self._request("POST", f"/v2/{name}/blobs/uploads/")
        location = start.headers.get("Location", "")
        if start.status_code != 202 or not location:
            raise PublishError(f"registry {self.host}: POST /v2/{name}/blobs/uploads/ answered {start.status_code}")
        target = location if location.startswith("/") else _path_of(location)
        if on_session is not None:
            on_session(target)
        sep = "&" if "?" in target else "?"
        with open(path, "rb") as fh:
            resp = self._request("PUT", f"{target}{sep}digest={digest}", data=fh,
                                 headers={"Content-Type": "application/octet-stream"})
        if resp.status_code != 201:
            raise PublishError(f"registry {self.host}: upload of {digest} to {name} answered {resp.status_code}: "
                               f"{resp.text[:200]}")

    def put_manifest(self, name: str, ref: str, body: bytes, media_type: str) -> str:
        """PUT a manifest under a tag or its digest; return the digest the registry reports (checked here)."""
        resp = self._request("PUT", f"/v2/{name}/manifests/{ref}", data=body, headers={"Content-Type": media_type})
        if resp.status_code != 201:
            raise PublishError(f"registry {self.host}: PUT /v2/{name}/manifests/{ref} answered {resp.status_code}: "
                               f"{resp.text[:200]}")
        computed = digest_of(body)
        reported = resp.headers.get("Docker-Content-Digest", "")
        if reported != computed:
            raise PublishError(f"registry {self.host}: {name}:{ref} stored as {reported or '(no digest)'}, "
                               f"the manifest bytes hash to {computed}")
        return computed

    def manifest_by_digest(self, name: str, digest: str) -> bytes:
        """GET a manifest by digest; its bytes must hash to that digest."""
        got = self.manifest(name, digest)
        if got["computed"] != digest:
            raise PublishError(f"registry {self.host}: {name}@{digest} serves bytes hashing to {got['computed']}")
        return bytes(got["content"])


def answers(host: str, timeout: float = 2.0) -> bool:
    """Whether something answers GET /v2/ on a loopback registry like a registry (200), never through a proxy."""
    try:
        return Registry(host, timeout_s=timeout)._request("GET", "/v2/").status_code == 200
    except (InfraError, PublishError):
        return False


def _path_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def verify_tag(reg: Registry, name: str, tag: str, pushed_digest: str, image_id: str, platform: str) -> dict[str, Any]:
    """Check that tag serves exactly the manifest we pushed, whose config is our image; return facts.

    Raises PublishError naming the first mismatch."""
    where = f"{reg.host}/{name}:{tag}"
    got = reg.manifest(name, tag)
    for label, value in (("HEAD Docker-Content-Digest", got["head_digest"]),
                         ("GET Docker-Content-Digest", got["get_digest"])):
        if value != got["computed"]:
            raise PublishError(f"{where}: {label} {value or '(missing)'} does not match the sha256 of the "
                               f"manifest bytes served ({got['computed']})")
    if pushed_digest and got["computed"] != pushed_digest:
        raise PublishError(f"{where}: registry serves {got['computed']}, the push reported {pushed_digest}")
    try:
        manifest = json.loads(got["content"])
    except ValueError:
        raise PublishError(f"{where}: manifest is not JSON") from None
    media_type = manifest.get("mediaType") or got["media_type"]
    if media_type in INDEX_TYPES:
        raise PublishError(f"{where}: registry serves an index ({media_type}); expected one image manifest")
    config_digest = (manifest.get("config") or {}).get("digest", "")
    if config_digest != image_id:
        raise PublishError(f"{where}: manifest config {config_digest or '(missing)'} is not image {image_id}")
    config = json.loads(reg.blob(name, config_digest))
    served_platform = f"{config.get('os', '?')}/{config.get('architecture', '?')}"
    if platform not in ("", "unknown") and served_platform != platform:
        raise PublishError(f"{where}: image platform {served_platform}, the report says {platform}")
    return {"digest": got["computed"], "config_digest": config_digest, "platform": served_platform,
            "media_type": media_type}


def push_blob(reg: Registry, name: str, data: bytes, on_session: Callable[[str], None] | None = None) -> str:
    """Upload a blob (monolithic POST then PUT) unless the registry has it; returns its digest. `on_session` is
    told the upload session's path (path and query, as a later DELETE cancels it) before the PUT."""
    digest = digest_of(data)
    if reg._request("HEAD", f"/v2/{name}/blobs/{digest}").status_code == 200:
        return digest
    start = reg._request("POST", f"/v2/{name}/blobs/uploads/")
    location = start.headers.get("Location", "")
    if start.status_code != 202 or not location:
        raise PublishError(f"registry {reg.host}: blob upload to {name} answered {start.status_code}, expected 202")
    if on_session is not None:
        path = urlsplit(location)
        on_session(path.path + (f"?{path.query}" if path.query else ""))
    sep = "&" if "?" in location else "?"
    done = reg._request("PUT", f"{location}{sep}digest={digest}", data=data,
                        headers={"Content-Type": "application/octet-stream"})
    if done.status_code != 201:
        raise PublishError(f"registry {reg.host}: blob {digest} upload answered {done.status_code}, expected 201")
    return digest


def put_manifest(reg: Registry, name: str, ref: str, data: bytes, media_type: str) -> requests.Response:
    """PUT a manifest or index under a tag or digest; PublishError unless 201."""
    resp = reg._request("PUT", f"/v2/{name}/manifests/{ref}", data=data, headers={"Content-Type": media_type})
    if resp.status_code != 201:
        raise PublishError(f"registry {reg.host}: PUT {name}:{ref} answered {resp.status_code}: {resp.text[:200]}")
    return resp


def get_json(reg: Registry, path: str, accept: str) -> dict[str, Any] | None:
    """GET a JSON document; None on 404."""
    resp = reg._request("GET", path, headers={"Accept": accept})
    if resp.status_code == 404:
        return None
    if resp.status_code != 200:
        raise PublishError(f"registry {reg.host}: GET {path} answered {resp.status_code}, expected 200")
    try:
        doc = resp.json()
    except ValueError:
        raise PublishError(f"registry {reg.host}: GET {path}: not JSON") from None
    if not isinstance(doc, dict):
        raise PublishError(f"registry {reg.host}: GET {path}: expected a JSON object")
    return doc
