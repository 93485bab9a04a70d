"""HTTP to one registry host (go-containerregistry's transport): TLS as Docker sets it up, then Basic or the
distribution token flow per scope, and every failure as one line.

TLS: literal loopback hosts speak plain HTTP (as the engine assumes); insecure hosts (the setting) HTTPS without
verification, then HTTP; every other host verified HTTPS against the default roots, the CA bundle setting and
certs.d/<host>/*.crt, with certs.d's *.cert/*.key as client certificate.
Tokens: a 401 with `Bearer realm=...` is answered by a token per scope (repository:<name>:<actions>), cached until
it expires; a token refused mid-way (expired) is renewed once. With an identity token the token service is asked
by OAuth2 POST (refresh_token grant), falling back to GET where it refuses the POST; else GET, with Basic
credentials when there are some."""
from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests
import urllib3

from builder.core.errors import InfraError, PublishError
from builder.core.options import Settings
from builder.engine.registry.keychain import Credential

LOOPBACK = re.compile(r"(127(\.\d{1,3}){3}|localhost|\[::1\])(:\d+)?")
CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
NAME = re.compile(r"/v2/(.+?)/(manifests|blobs|tags|referrers)(/|$)")
MARGIN_S = 5.0  # a token this close to its expiry is renewed before it is sent


def is_loopback(host: str) -> bool:
    return bool(LOOPBACK.fullmatch(host))


@dataclass(frozen=True)
class TLS:
    """How to reach a host: scheme, what to verify against, a client certificate, whether it is insecure."""
    scheme: str = "https"
    verify: bool | str = True
    cert: tuple[str, str] | None = None
    insecure: bool = False
    certs_d: str = "/etc/docker/certs.d"  # where the one-line TLS error says to put the host's CA

    @classmethod
    def for_host(cls, host: str, settings: Settings) -> TLS:
        if is_loopback(host):
            return cls(scheme="http", verify=False)
        if host in settings.insecure_registries:
            return cls(verify=False, insecure=True)
        folder = settings.certs_d / host
        cas = sorted(folder.glob("*.crt")) if folder.is_dir() else []
        certs = sorted(folder.glob("*.cert")) if folder.is_dir() else []
        cert = next(((str(c), str(c.with_suffix(".key"))) for c in certs if c.with_suffix(".key").is_file()), None)
        extra = cas + ([settings.ca_bundle] if settings.ca_bundle else [])
        return cls(verify=_bundle(extra, settings) if extra else True, cert=cert, certs_d=str(settings.certs_d))


def _bundle(extra: list[Path], settings: Settings) -> str:
    """One PEM file: the default roots (certifi, as requests uses) and the extra CAs, cached by content."""
    import certifi  # lazy: only when a host has its own CA

    text = Path(certifi.where()).read_text() + "".join("\n" + p.read_text() for p in extra)
    path = settings.cache("registry-ca") / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.pem"
    if not path.exists():
        path.write_text(text)
    return str(path)


def scope_of(method: str, path: str, params: dict[str, Any] | None) -> str:
    """The token scope a request needs: pull to read, pull,push to write, delete to delete; a mount adds
    pull on its source. '' for /v2/ itself."""
    parts = urlsplit(path)
    found = NAME.search(parts.path)
    if not found:
        return ""
    action = "pull" if method in ("GET", "HEAD") else "delete" if method == "DELETE" else "pull,push"
    if method == "DELETE" and "/blobs/uploads/" in parts.path:
        action = "pull,push"  # cancelling our own upload
    scopes = [f"repository:{found.group(1)}:{action}"]
    query = {**parse_qs(parts.query), **{k: [str(v)] for k, v in (params or {}).items()}}
    if "from" in query:
        scopes.append(f"repository:{query['from'][0]}:pull")
    return " ".join(scopes)


class Transport:
    """One host's session, its challenge and its tokens per scope (thread-safe for the copy's workers)."""

    def __init__(self, host: str, credential: Credential | None, tls: TLS, timeout_s: float = 30.0) -> None:
        self.host, self.credential, self.tls, self.timeout_s = host, credential, tls, timeout_s
        self.base = f"{tls.scheme}://{host}"
        self.session = requests.Session()
        self.session.trust_env = False  # no proxies from the environment, no netrc
        self.session.verify = tls.verify
        self.session.cert = tls.cert
        if tls.insecure:  # named insecure on purpose: no warning per request (Docker prints none either)
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.secrets = credential.secrets() if credential else []
        self.challenge: dict[str, str] | None = None  # {"scheme": "bearer"|"basic", "realm", "service", ...}
        self.tokens: dict[str, tuple[str, float]] = {}  # scope -> (token, expires at)
        self.token_requests = 0
        self._lock = threading.Lock()

    # ---- sending

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Send with the credential the host asked for; one renewal after a refused token."""
        url = path if "://" in path else self.base + path
        scope = scope_of(method, path, kwargs.get("params"))
        resp = self._send(method, url, scope, **kwargs)
        if resp.status_code == 401:
            self._learn(resp, scope)
            if self.challenge is not None:
                with self._lock:
                    self.tokens.pop(scope, None)
                resp = self._send(method, url, scope, **kwargs)
        if resp.status_code >= 500:
            raise InfraError(f"registry {self.host}: {method} {urlsplit(url).path[:120]} answered {resp.status_code}")
        if resp.status_code == 401:
            raise PublishError(self._refused(method, url, scope))
        return resp

    def _send(self, method: str, url: str, scope: str, **kwargs: Any) -> requests.Response:
        headers = dict(kwargs.pop("headers", None) or {})
        auth = self._authorization(scope)
        if auth:
            headers["Authorization"] = auth
        data = kwargs.get("data")
        if data is not None and hasattr(data, "seek"):
            data.seek(0)  # a file sent again after a 401
        try:
            return self.session.request(method, url, headers=headers, timeout=self.timeout_s, allow_redirects=True,
                                        **kwargs)
        except requests.exceptions.SSLError as exc:
            if self.tls.insecure and self.tls.scheme == "https":
                self.tls = TLS(scheme="http", verify=False, insecure=True)
                self.base = f"http://{self.host}"
                return self._send(method, self.base + urlsplit(url).path + _query(url), scope, headers=headers,
                                  **kwargs)
            raise InfraError(self.mask(self._tls_line(exc))) from None
        except requests.RequestException as exc:
            if self.tls.insecure and self.tls.scheme == "https" and isinstance(exc, requests.ConnectionError):
                self.tls = TLS(scheme="http", verify=False, insecure=True)
                self.base = f"http://{self.host}"
                return self._send(method, self.base + urlsplit(url).path + _query(url), scope, headers=headers,
                                  **kwargs)
            raise InfraError(self.mask(f"registry {self.host}: unreachable ({type(exc).__name__}); is it running?")) \
                from None

    def _tls_line(self, exc: Exception) -> str:
        text = str(exc)
        reason = re.search(r"certificate verify failed: ([^(')\"]+)", text)
        what = f"TLS certificate did not verify ({reason.group(1).strip()})" if reason else \
            "TLS handshake failed (not HTTPS?)"
        return (f"registry {self.host}: {what}; put its CA in {self.tls.certs_d}/{self.host}/ca.crt "
                "(BUILDER_REGISTRY_CERTS_D) or BUILDER_REGISTRY_CA_BUNDLE, or name the host in "
                "BUILDER_INSECURE_REGISTRIES")

    # ---- credentials

    def _authorization(self, scope: str) -> str | None:
        if self.challenge is None:
            return None
        if self.challenge["scheme"] == "basic":
            return _basic(self.credential) if self.credential and self.credential.password else None
        with self._lock:
            token, expires = self.tokens.get(scope, ("", 0.0))
            if not token or time.monotonic() > expires - MARGIN_S:
                token = self._fetch_token(scope)
        return f"Bearer {token}"

    def _learn(self, resp: requests.Response, scope: str) -> None:
        header = resp.headers.get("WWW-Authenticate", "")
        kind = header.split(" ", 1)[0].lower()
        if kind not in ("bearer", "basic"):
            return
        fields = {k.lower(): v for k, v in CHALLENGE.findall(header)}
        if kind == "bearer" and not fields.get("realm"):
            raise PublishError(f"registry {self.host}: 401 with a bearer challenge that names no realm")
        self.challenge = {"scheme": kind, **fields}

    def _fetch_token(self, scope: str) -> str:
        """A token for `scope` from the challenge's realm (POST with an identity token, else GET); cached."""
        assert self.challenge is not None
        realm, service = self.challenge["realm"], self.challenge.get("service", "")
        cred = self.credential
        form: dict[str, str] = {"client_id": "rl-image-builder"}
        if service:
            form["service"] = service
        if scope:
            form["scope"] = scope
        self.token_requests += 1
        resp = None
        try:
            if cred and cred.identity_token:
                resp = self.session.post(realm, data={**form, "grant_type": "refresh_token",
                                                      "refresh_token": cred.identity_token}, timeout=self.timeout_s)
                if resp.status_code in (400, 404, 405) and cred.password:
                    resp = None  # the service refuses OAuth2 POST (Harbor): GET with Basic
            if resp is None:
                params = {k: v for k, v in form.items() if k != "client_id"}
                if cred and cred.username:
                    params["account"] = cred.username
                basic = {"Authorization": _basic(cred)} if cred and cred.password else {}
                resp = self.session.get(realm, params=params, headers=basic, timeout=self.timeout_s)
        except requests.exceptions.SSLError as exc:
            raise InfraError(self.mask(self._tls_line(exc).replace(self.host, urlsplit(realm).netloc, 1))) from None
        except requests.RequestException as exc:
            raise InfraError(f"registry {self.host}: token service {_where(realm)} unreachable "
                             f"({type(exc).__name__})") from None
        if resp.status_code != 200:
            what = f"check the credentials for {self.host}" if cred else \
                f"no credentials for {self.host}: docker login {self.host}"
            raise PublishError(f"registry {self.host}: token service {_where(realm)} refused "
                               f"{scope or 'a token'} ({resp.status_code}); {what}")
        try:
            doc = resp.json()
            token = str(doc.get("token") or doc.get("access_token") or "")
            life = float(doc.get("expires_in") or 60)
        except (ValueError, TypeError, AttributeError):
            token, life = "", 0.0
        if not token:
            raise PublishError(f"registry {self.host}: token service {_where(realm)} answered no token")
        self.secrets.append(token)
        self.tokens[scope] = (token, time.monotonic() + max(life, 0.0))
        return token

    def _refused(self, method: str, url: str, scope: str) -> str:
        path = urlsplit(url).path[:120]
        if self.challenge is None:
            return f"registry {self.host}: {method} {path}: 401 unauthorized (no challenge to answer)"
        if self.credential is None:
            return (f"registry {self.host}: {method} {path}: 401 unauthorized; no credentials for {self.host}: "
                    f"docker login {self.host}, or BUILDER_REGISTRY_USERNAME / BUILDER_REGISTRY_PASSWORD")
        what = f"the token for {scope}" if self.challenge["scheme"] == "bearer" and scope else "the credentials"
        return (f"registry {self.host}: {method} {path}: 401 unauthorized: {what} refused; check the credentials "
                f"for {self.host}")

    def mask(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, "***")
        return text


def _basic(cred: Credential | None) -> str:
    assert cred is not None
    return "Basic " + base64.b64encode(f"{cred.username}:{cred.password}".encode()).decode()


def _query(url: str) -> str:
    query = urlsplit(url).query
    return f"?{query}" if query else ""


def _where(realm: str) -> str:
    parts = urlsplit(realm)
    return f"{parts.netloc}{parts.path}"
