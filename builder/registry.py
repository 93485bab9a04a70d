"""Registry HTTP API v2 client: read back what a registry serves for a tag and verify it ourselves.

The registry's word (the Docker-Content-Digest header) is never taken alone: the manifest bytes are
hashed here and the config blob is fetched and hashed too.  Basic auth only (htpasswd registries);
a registry that asks for a bearer token is refused with a clear message.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import requests

from builder.errors import InfraError, PublishError

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
INDEX_TYPES = MANIFEST_TYPES[1], MANIFEST_TYPES[3]


def split_repository(repository: str) -> tuple[str, str]:
    """'127.0.0.1:5000/demo/unified' -> ('127.0.0.1:5000', 'demo/unified')."""
    host, _, name = repository.partition("/")
    if not name or not ("." in host or ":" in host or host == "localhost"):
        raise PublishError(f"image.repository {repository!r}: expected host[:port]/name with an explicit registry host")
    return host, name


def mask(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


class Registry:
    """One registry host; `auth` is (username, password) or None."""

    def __init__(self, host: str, auth: tuple[str, str] | None = None, scheme: str | None = None,
                 timeout_s: float = 30.0):
        self.host = host
        self.timeout_s = timeout_s
        # loopback registries speak plain HTTP (as the Docker engine assumes for 127.0.0.0/8)
        local = host.startswith(("127.", "localhost"))
        self.base = f"{scheme or ('http' if local else 'https')}://{host}"
        self.session = requests.Session()
        self.session.trust_env = False  # no proxies from the environment, no netrc
        self.session.auth = auth
        self.secrets = [auth[1]] if auth else []

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        url = self.base + path
        try:
            resp = self.session.request(method, url, timeout=self.timeout_s, allow_redirects=True, **kwargs)
        except requests.RequestException as exc:
            raise InfraError(mask(f"registry {self.host}: unreachable ({type(exc).__name__}); is it running?",
                                  self.secrets)) from None
        if resp.status_code == 401:
            challenge = resp.headers.get("WWW-Authenticate", "")
            raise PublishError(f"registry {self.host}: {method} {path}: 401 unauthorized"
                               + (" (bearer token auth is not supported; use basic auth)"
                                  if challenge.lower().startswith("bearer") else
                                  "; set BUILDER_REGISTRY_USERNAME / BUILDER_REGISTRY_PASSWORD"))
        return resp

    def ping(self) -> None:
        """InfraError when nothing answers /v2/ like a registry."""
        resp = self._request("GET", "/v2/")
        if resp.status_code != 200:
            raise InfraError(f"registry {self.host}: GET /v2/ answered {resp.status_code}, expected 200")

    def manifest(self, name: str, ref: str) -> dict:
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
            "computed": "sha256:" + hashlib.sha256(got.content).hexdigest(),
            "content": got.content,
            "media_type": got.headers.get("Content-Type", "").split(";")[0].strip(),
        }

    def tag_digest(self, name: str, tag: str) -> str | None:
        """The digest a tag serves now (HEAD), or None when the tag does not exist."""
        resp = self._request("HEAD", f"/v2/{name}/manifests/{tag}", headers={"Accept": ", ".join(MANIFEST_TYPES)})
        return resp.headers.get("Docker-Content-Digest") if resp.status_code == 200 else None

    def delete_manifest(self, name: str, digest: str) -> bool:
        """DELETE a manifest by digest (every tag on it goes too); True when the registry accepted."""
        return self._request("DELETE", f"/v2/{name}/manifests/{digest}").status_code == 202

    def blob(self, name: str, digest: str) -> bytes:
        """GET a blob and check its sha256 against the digest asked for."""
        path = f"/v2/{name}/blobs/{digest}"
        resp = self._request("GET", path)
        if resp.status_code != 200:
            raise PublishError(f"registry {self.host}: GET {path} answered {resp.status_code}, expected 200")
        computed = "sha256:" + hashlib.sha256(resp.content).hexdigest()
        if computed != digest:
            raise PublishError(f"registry {self.host}: blob {digest} has content {computed}")
        return resp.content


def verify_tag(reg: Registry, name: str, tag: str, pushed_digest: str, image_id: str, platform: str) -> dict:
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
