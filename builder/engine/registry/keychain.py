"""Whose credentials go to which registry host (go-containerregistry's authn, Docker's rules).

In order: BUILDER_REGISTRY_* for their one host (BUILDER_REGISTRY_HOST, else the release's), Docker's config.json
(`auths` with `identitytoken`, `credsStore`, `credHelpers` through `docker-credential-*`, by the docker SDK),
containers' auth.json (REGISTRY_AUTH_FILE). A credential is never offered to another host.
Docker Hub follows Docker's names: the API on registry-1.docker.io, `library/` for bare names, and its
credentials under https://index.docker.io/v1/."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.errors import BadInput
from builder.core.imageref import HUB_HOSTS
from builder.core.options import Settings

HUB_API = "registry-1.docker.io"
HUB_KEY = "https://index.docker.io/v1/"


@dataclass(frozen=True)
class Credential:
    """A username and password (Basic, or the token service's GET), or an identity (refresh) token for its POST."""
    username: str = ""
    password: str = ""
    identity_token: str = ""

    def secrets(self) -> list[str]:
        return [s for s in (self.password, self.identity_token) if s]

    def __repr__(self) -> str:  # never show a secret
        return f"Credential(username={self.username!r}, secret={'set' if self.secrets() else 'unset'})"


def is_hub(host: str) -> bool:
    return host in HUB_HOSTS


def api_host(host: str) -> str:
    """The host whose /v2/ answers for `host` (Docker Hub's API lives on registry-1.docker.io)."""
    return HUB_API if is_hub(host) else host


def _from_entry(entry: dict[str, Any] | None) -> Credential | None:
    """The docker SDK's auth entry (its keys come in two spellings) as a Credential."""
    if not entry:
        return None
    low = {k.lower(): v for k, v in entry.items() if isinstance(v, str)}
    cred = Credential(low.get("username", ""), low.get("password", ""), low.get("identitytoken", ""))
    return cred if cred.secrets() else None


class Keychain:
    """The credentials of each host, from the settings' sources (read when first asked)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def resolve(self, host: str) -> Credential | None:
        own = self.settings.registry_host
        if self.settings.registry_auth and own and api_host(own) == api_host(host):
            return Credential(*self.settings.registry_auth)
        return self._docker(host) or self._containers(host)

    def _docker(self, host: str) -> Credential | None:
        import docker.auth  # lazy: docker SDK, slow to import
        import docker.errors  # lazy: docker SDK, with its auth

        folder = self.settings.docker_config or Path.home() / ".docker"
        path = folder / "config.json"
        if not path.is_file():
            return None
        try:
            config = docker.auth.load_config(config_path=str(path))
            return _from_entry(config.resolve_authconfig("docker.io" if is_hub(host) else host))
        except docker.errors.DockerException as exc:  # a credential helper failed or is missing
            helper = str(exc).split("Credentials store error:")[-1].strip()[:160]
            raise BadInput(f"{path}: the credential helper for {host} failed: {helper}") from None

    def _containers(self, host: str) -> Credential | None:
        import docker.auth  # lazy: docker SDK, slow to import
        import docker.errors  # lazy: docker SDK, with its auth

        path = self.settings.registry_auth_file
        if path is None:
            return None
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            entries = docker.auth.parse_auth(doc.get("auths") or {}, raise_on_error=True)
        except (OSError, ValueError, AttributeError, docker.errors.DockerException):
            raise BadInput(f"REGISTRY_AUTH_FILE {path}: expected a containers auth.json "
                           "({\"auths\": {host: {\"auth\": base64}}})") from None
        keys = (HUB_KEY, *HUB_HOSTS) if is_hub(host) else (host,)
        for key, entry in entries.items():
            if key.removeprefix("https://").removeprefix("http://").rstrip("/") in keys or key in keys:
                return _from_entry(entry)
        return None


def auth_config(host: str, settings: Settings) -> dict[str, str] | None:
    """The engine's `auth_config` for a pull or push on `host`: that host's own credential, or None."""
    cred = Keychain(settings).resolve(host)
    if cred is None:
        return None
    if cred.identity_token:
        return {"identitytoken": cred.identity_token}
    return {"username": cred.username, "password": cred.password}
