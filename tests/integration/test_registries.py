"""The registry door against real Debian `docker-registry` processes (distribution 2.8): (a) TLS from a test CA with
htpasswd, (b) TLS with `auth.token` from a token service here that signs JWTs the registry checks through its
`rootcertbundle`, (c) a plain second registry for a base on another registry. They are reached as `registry.test`,
a name an /etc/hosts line (added and removed here) resolves to loopback, so the tool's own TLS is what is tested.
Each refusal is one line naming the host, and nothing is published; an expired token is renewed."""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import socket
import subprocess
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from builder import pipeline
from builder.core.errors import InfraError, PublishError
from builder.core.options import Settings
from builder.engine.registry import Registry, copy_blobs, push_blob, put_manifest, verify_tag
from tests.faultstack import REGISTRY_BIN, free_port, wait_for
from tests.fixture_types import DockerClient, MakeReportInputs
from tests.integration.test_publish import report_for, tiny_images  # noqa: F401 (a fixture)

pytestmark = pytest.mark.docker  # real registry processes: one xdist group (release, tests/budget.py) for the /etc/hosts line
NAME = "registry.test"
USER, PASSWORD = "ci", "planted-Registry-Secret-5150"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def cert(name: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey,
         ca: bool, dns: str | None = None) -> x509.Certificate:
    now = datetime.now(UTC)
    build = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(hours=1))
             .not_valid_after(now + timedelta(hours=2)).add_extension(x509.BasicConstraints(ca=ca, path_length=None),
                                                                     critical=True))
    if dns:
        build = build.add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False)
    return build.sign(signer, hashes.SHA256())


def pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Tokens:
    """A token service per the distribution token spec: GET with Basic (or anonymous), JWTs signed ES256 with an
    x5c chain to the registry's rootcertbundle. `grant` limits the actions; `exp_offset` sets exp from now."""

    def __init__(self, folder: Path) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "token signer")])
        self.cert = cert(subject, self.key, subject, self.key, ca=True)
        self.bundle = folder / "token-root.pem"
        self.bundle.write_bytes(pem(self.cert))
        self.grant, self.exp_offset, self.refuse, self.calls = "pull,push", 300, False, 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def jwt(self, scope: str, account: str) -> str:
        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        access = []
        for item in scope.split():
            kind, name, actions = item.split(":")
            access.append({"type": kind, "name": name,
                           "actions": [a for a in actions.split(",") if a in self.grant.split(",")]})
        now = int(time.time())
        claims = {"iss": "test-issuer", "sub": account, "aud": NAME, "exp": now + self.exp_offset, "nbf": now - 10,
                  "iat": now - 10, "jti": uuid.uuid4().hex, "access": access}
        header = {"alg": "ES256", "typ": "JWT", "x5c": [base64.b64encode(self.cert.public_bytes(
            serialization.Encoding.DER)).decode()]}
        signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                service.calls += 1
                query = parse_qs(urlsplit(self.path).query)
                good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if self.headers.get("Authorization") != good or service.refuse:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"token": service.jwt(query.get("scope", [""])[0], USER),
                                   "expires_in": 300}).encode()  # the JWT's own exp is what the registry checks
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """registry.test on loopback; (a) TLS + htpasswd, (b) TLS + token auth, (c) plain; the CA in a certs.d."""
    folder = tmp_path_factory.mktemp("registries")
    line = f"127.0.0.1 {NAME}  # builder tests {os.getpid()}\n"
    hosts = Path("/etc/hosts")
    procs: list[subprocess.Popen[bytes]] = []
    tokens = Tokens(folder)
    hosts.write_text(hosts.read_text() + line)  # in place: /etc/hosts may be a bind mount
    try:
        yield start(folder, tokens, procs)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        tokens.server.shutdown()
        tokens.server.server_close()
        hosts.write_text(hosts.read_text().replace(line, ""))


def start(folder: Path, tokens: Tokens, procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "builder test CA")])
    ca = cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    server = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)]), key, ca_name, ca_key, ca=False, dns=NAME)
    (folder / "ca.crt").write_bytes(pem(ca))
    (folder / "server.crt").write_bytes(pem(server))
    (folder / "server.key").write_bytes(pem(key))
    with warnings.catch_warnings():  # crypt is deprecated (removed in 3.13); bcrypt is not installed
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # lazy: deprecated module, only for the htpasswd line

    salt = crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)  # cheap: the registry checks it on every request
    (folder / "htpasswd").write_text(f"{USER}:{crypt.crypt(PASSWORD, salt)}\n")
    ports = {}
    auths = {"a": {"htpasswd": {"realm": "tests", "path": str(folder / "htpasswd")}},
             "b": {"token": {"realm": tokens.realm, "service": NAME, "issuer": "test-issuer",
                             "rootcertbundle": str(tokens.bundle)}}, "c": None}
    for kind, auth in auths.items():
        port = ports[kind] = free_port()
        http: dict[str, Any] = {"addr": f"127.0.0.1:{port}"}
        if kind != "c":
            http["tls"] = {"certificate": str(folder / "server.crt"), "key": str(folder / "server.key")}
        config = {"version": 0.1, "log": {"level": "warn"}, "http": http,
                  "storage": {"filesystem": {"rootdirectory": str(folder / f"data-{kind}")}, "delete": {"enabled": True}},
                  **({"auth": auth} if auth else {})}
        (folder / f"{kind}.yml").write_text(json.dumps(config))
        with open(folder / f"{kind}.log", "wb") as log:
            procs.append(subprocess.Popen([REGISTRY_BIN, "serve", str(folder / f"{kind}.yml")], stdout=log,
                                          stderr=subprocess.STDOUT))
    certs_d = folder / "certs.d"
    for kind in "ab":
        (certs_d / f"{NAME}:{ports[kind]}").mkdir(parents=True)
        (certs_d / f"{NAME}:{ports[kind]}" / "ca.crt").write_bytes(pem(ca))
    for kind in "abc":
        port = ports[kind]
        wait_for(functools.partial(listening, port), f"registry {kind}", 20)
    return {"folder": folder, "ports": ports, "tokens": tokens, "certs_d": certs_d, "ca": folder / "ca.crt"}


def listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), 1):
        return True


def settings(world: dict[str, Any], host: str, **env: str) -> Settings:
    base = {"BUILDER_CACHE": str(world["folder"] / "cache"), "DOCKER_CONFIG": str(world["folder"] / "docker"),
            "BUILDER_REGISTRY_CERTS_D": str(world["certs_d"]), "BUILDER_INDEX_URL": "http://127.0.0.1:9/simple",
            "BUILDER_REGISTRY_USERNAME": USER, "BUILDER_REGISTRY_PASSWORD": PASSWORD, "BUILDER_REGISTRY_TIMEOUT": "10"}
    return Settings.from_env({**base, **env}).for_release(f"{host}/demo/rel")


def publish(reg: Registry, name: str, tag: str) -> str:
    """A small image (config + one layer) pushed and tagged; the digest after verify_tag checked it."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                         "config": {}, "seed": uuid.uuid4().hex}).encode()
    layer = os.urandom(1 << 16)
    manifest: dict[str, Any] = {"schemaVersion": 2, "mediaType": MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
                           "digest": push_blob(reg, name, config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "size": len(layer),
                            "digest": push_blob(reg, name, layer)}]}
    body = json.dumps(manifest).encode()
    put_manifest(reg, name, tag, body, MANIFEST)
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    return str(verify_tag(reg, name, tag, digest, manifest["config"]["digest"], "linux/amd64")["digest"])


def tags_of(world: dict[str, Any], host: str, name: str) -> list[str]:
    return Registry.from_settings(host, settings(world, host)).tags(name)


def one_line(err: pytest.ExceptionInfo[PublishError] | pytest.ExceptionInfo[InfraError], host: str) -> str:
    line = str(err.value)
    assert "\n" not in line and host in line and PASSWORD not in line and "is it running" not in line, line
    return line


def test_tls_htpasswd_publishes_and_refuses_in_one_line(world: dict[str, Any]) -> None:
    host = f"{NAME}:{world['ports']['a']}"
    assert publish(Registry.from_settings(host, settings(world, host)), "demo/rel", "ok").startswith("sha256:")
    wrong = settings(world, host, BUILDER_REGISTRY_PASSWORD="wrong-" + PASSWORD)
    with pytest.raises(PublishError) as err:
        publish(Registry.from_settings(host, wrong), "demo/wrong", "x")
    assert "the credentials refused" in one_line(err, host)
    unknown = settings(world, host, BUILDER_REGISTRY_CERTS_D=str(world["folder"] / "none"))
    with pytest.raises(InfraError) as tls_err:  # planted: the CA is nowhere the tool looks
        publish(Registry.from_settings(host, unknown), "demo/unknown", "x")
    assert f"certs.d/{host}/ca.crt" in one_line(tls_err, host)
    with pytest.raises(InfraError):  # the plain registry (c) under its name: not HTTPS and not named insecure
        publish(Registry.from_settings(f"{NAME}:{world['ports']['c']}", unknown), "demo/plain", "x")
    named = settings(world, host, BUILDER_REGISTRY_CA_BUNDLE=str(world["ca"]), BUILDER_REGISTRY_CERTS_D="/nonexistent")
    publish(Registry.from_settings(host, named), "demo/bundle", "ok")
    assert [tags_of(world, host, n) for n in ("demo/wrong", "demo/unknown")] == [[], []]  # nothing published


def test_token_auth_publishes_renews_and_refuses_in_one_line(world: dict[str, Any]) -> None:
    host, tokens = f"{NAME}:{world['ports']['b']}", world["tokens"]
    reg = Registry.from_settings(host, settings(world, host))
    calls = tokens.calls
    publish(reg, "demo/rel", "ok")
    assert tokens.calls - calls == 2  # two scopes (pull for the HEADs, pull,push to write), one token each, cached
    tokens.exp_offset = -59  # distribution accepts a token until 60 s after its exp: this one dies in a second
    try:
        late = Registry.from_settings(host, settings(world, host))
        push_blob(late, "demo/late", b"first")
        calls = tokens.calls
        time.sleep(1.5)  # the cached tokens expire between two requests of the publish
        publish(late, "demo/late", "ok")  # the registry's 401 is answered by a renewed token
        assert late.tags("demo/late") == ["ok"] and tokens.calls > calls
    finally:
        tokens.exp_offset = 300
    tokens.grant = "pull"
    try:
        with pytest.raises(PublishError) as err:
            publish(Registry.from_settings(host, settings(world, host)), "demo/pullonly", "x")
        assert "the token for repository:demo/pullonly:pull,push refused" in one_line(err, host)
    finally:
        tokens.grant = "pull,push"
    reg = Registry.from_settings(host, settings(world, host))
    publish(reg, "demo/renew", "ok")
    tokens.refuse = True
    try:
        reg.transport.tokens = {k: (t, 0.0) for k, (t, _) in reg.transport.tokens.items()}  # due for renewal
        with pytest.raises(PublishError) as err:
            publish(reg, "demo/renew", "second")
        assert "token service" in one_line(err, host) and "refused" in str(err.value)
    finally:
        tokens.refuse = False
    assert tags_of(world, host, "demo/pullonly") == [] and tags_of(world, host, "demo/renew") == ["ok"]


def test_base_on_another_registry_is_copied_once(world: dict[str, Any]) -> None:
    base_host, rel_host = f"{NAME}:{world['ports']['b']}", f"{NAME}:{world['ports']['a']}"
    base = Registry.from_settings(base_host, settings(world, rel_host))  # the release's password: not for the base
    with pytest.raises(PublishError):
        publish(base, "demo/base", "x")  # planted: the base registry gets no credential of the release's
    token_base = Registry.from_settings(base_host, settings(world, base_host))
    digest = publish(token_base, "demo/base", "v1")
    manifest = json.loads(token_base.manifest_by_digest("demo/base", digest))
    rel = Registry.from_settings(rel_host, settings(world, rel_host))
    blobs = [*manifest["layers"], manifest["config"]]
    first = copy_blobs(token_base, "demo/base", rel, "demo/rel", blobs)
    assert first["copied"] == 2 and first["bytes"] > 1 << 16
    again = copy_blobs(token_base, "demo/base", rel, "demo/rel", blobs)
    assert again["present"] == 2 and again["bytes"] == 0  # a second copy moves 0 bytes


def test_no_secret_in_the_registries_logs_or_files(world: dict[str, Any], capfd: pytest.CaptureFixture[str]) -> None:
    """After the publishes above (and their refusals): the password is in no log, cache or printed line."""
    host = f"{NAME}:{world['ports']['a']}"
    publish(Registry.from_settings(host, settings(world, host)), "demo/grep", "ok")
    files = [p for p in world["folder"].rglob("*") if p.is_file() and p.name != "htpasswd" and
             p.stat().st_size < 1 << 20]
    texts = [p.read_bytes().decode("utf-8", "replace") for p in files] + list(capfd.readouterr())
    assert len(files) >= 3 and all(PASSWORD not in text for text in texts)


def test_builder_publish_through_token_auth_with_only_a_docker_config(
        world: dict[str, Any], report_inputs: MakeReportInputs, docker_client: DockerClient,
        tiny_images: dict[str, str], tmp_path: Path) -> None:  # noqa: F811 (the imported fixture)
    """`builder publish` of a report to the TLS + token registry with the credentials only in Docker's config.json:
    the engine pushes with that host's auth_config, the tool promotes and verifies through the token flow."""
    host = f"{NAME}:{world['ports']['b']}"
    docker = tmp_path / "docker"
    docker.mkdir()
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (docker / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    only_config = Settings.from_env({"BUILDER_CACHE": str(world["folder"] / "cache"), "DOCKER_CONFIG": str(docker),
                                     "BUILDER_REGISTRY_CERTS_D": str(world["certs_d"]),
                                     "BUILDER_INDEX_URL": "http://127.0.0.1:9/simple"})
    rep, paths = report_for(report_inputs, tmp_path / "run", f"{host}/demo/unified", tiny_images["a"], docker_client)
    receipt = pipeline.publish_report(paths["json"], only_config)
    reg = Registry.from_settings(host, only_config)
    assert reg.tag_digest("demo/unified", rep.tags[0]) == receipt.digest
    seen = subprocess.run(["skopeo", "inspect", "--raw", f"--cert-dir={world['certs_d']}/{host}",
                           f"--creds={USER}:{PASSWORD}", f"docker://{host}/demo/unified:{rep.tags[0]}"],
                          capture_output=True, check=True).stdout  # an independent client, the same credentials
    assert "sha256:" + hashlib.sha256(seen).hexdigest() == receipt.digest
    (docker / "config.json").write_text(json.dumps({"auths": {}}))  # planted: no credential for the host
    _, bad = report_for(report_inputs, tmp_path / "bad", f"{host}/demo/nocreds", tiny_images["b"], docker_client)
    with pytest.raises(PublishError, match=f"registry {host}: .*no credentials for {host}|token service .* refused"):
        pipeline.publish_report(bad["json"], only_config)
    assert reg.tags("demo/nocreds") == []
