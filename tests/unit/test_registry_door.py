"""The registry door against an in-process fake registry and token service (tests/fake_registry.py): the token
flow per scope, renewal, OAuth2 POST and its GET fallback, Basic, credentials per host, TLS lines, DELETE refused,
the cross-registry copy. Each check has its planted failure beside it."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import ssl
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from builder.core.errors import BadInput, InfraError, PublishError
from builder.core.options import Settings
from builder.engine import registry
from builder.engine.registry import TLS, Keychain, Registry, Transport, copy_blobs
from builder.engine.registry.transport import scope_of
from tests.fake_registry import Fake, World

SECRET = "s3cret-pass"


def settings(tmp_path: Path, **env: str) -> Settings:
    return Settings.from_env({"BUILDER_CACHE": str(tmp_path / "cache"), "DOCKER_CONFIG": str(tmp_path / "docker"),
                              "BUILDER_INDEX_URL": "http://127.0.0.1:9/simple", **env})


@pytest.fixture
def fake() -> Iterator[Fake]:
    server = Fake(World())
    yield server
    server.close()


def put_blob(reg: Registry, name: str, data: bytes) -> str:
    return registry.push_blob(reg, name, data)


# ---------------------------------------------------------------- the token flow


def test_anonymous_token_per_scope_is_fetched_once(fake: Fake) -> None:
    fake.world.auth = "bearer"
    reg = Registry(fake.host)
    digest = put_blob(reg, "demo/a", b"x" * 10)
    assert reg.blob("demo/a", digest) == b"x" * 10 and reg.blob("demo/a", digest) == b"x" * 10
    scopes = [s for _, s in fake.world.token_calls]
    assert sorted(set(scopes)) == ["repository:demo/a:pull", "repository:demo/a:pull,push"]
    assert len(scopes) == len(set(scopes))  # one token request per scope


def test_mount_asks_pull_on_its_source_and_delete_asks_delete() -> None:
    assert scope_of("POST", "/v2/rel/blobs/uploads/", {"mount": "sha256:x", "from": "base"}) == \
        "repository:rel:pull,push repository:base:pull"
    assert scope_of("DELETE", "/v2/rel/manifests/sha256:x", None) == "repository:rel:delete"
    assert scope_of("GET", "/v2/", None) == ""


def test_expired_token_is_renewed_mid_push(fake: Fake) -> None:
    fake.world.auth, fake.world.token_life = "bearer", 300
    reg = Registry(fake.host)
    put_blob(reg, "demo/a", b"one")
    for token in fake.world.tokens:  # every token the service gave expires now (the client still holds it)
        fake.world.tokens[token] = (fake.world.tokens[token][0], time.time() - 1)
    put_blob(reg, "demo/a", b"two")
    assert len([s for _, s in fake.world.token_calls if s == "repository:demo/a:pull,push"]) == 2


def test_refused_renewal_is_one_line_naming_the_host(fake: Fake) -> None:
    fake.world.auth = "bearer"
    reg = Registry(fake.host, auth=("ci", SECRET))
    put_blob(reg, "demo/a", b"one")
    fake.world.user = ("ci", "rotated")  # the service now refuses our credentials
    for token in fake.world.tokens:
        fake.world.tokens[token] = (fake.world.tokens[token][0], time.time() - 1)
    with pytest.raises(PublishError) as err:
        put_blob(reg, "demo/a", b"two")
    line = str(err.value)
    assert "\n" not in line and fake.host in line and "refused" in line and SECRET not in line


def test_pull_only_token_refuses_the_push_in_one_line(fake: Fake) -> None:
    fake.world.auth, fake.world.grant = "bearer", "pull"
    with pytest.raises(PublishError, match=r"401 unauthorized: the token for repository:demo/a:pull,push refused"):
        put_blob(Registry(fake.host, auth=("ci", SECRET)), "demo/a", b"x")


def test_identity_token_by_post_and_get_fallback(fake: Fake) -> None:
    fake.world.auth, fake.world.refresh = "bearer", "refresh-token-77"
    cred = registry.Credential(username="ci", password=SECRET, identity_token="refresh-token-77")
    reg = Registry(fake.host, credential=cred)
    put_blob(reg, "demo/a", b"x")
    assert {m for m, _ in fake.world.token_calls} == {"POST"}
    fake.world.post_refused, fake.world.token_calls = True, []
    put_blob(Registry(fake.host, credential=cred), "demo/b", b"y")
    assert [m for m, _ in fake.world.token_calls][:2] == ["POST", "GET"]


def test_basic_where_asked_and_a_wrong_password_is_one_line(fake: Fake) -> None:
    fake.world.auth = "basic"
    put_blob(Registry(fake.host, auth=("ci", SECRET)), "demo/a", b"x")
    with pytest.raises(PublishError) as err:
        put_blob(Registry(fake.host, auth=("ci", "wrong-" + SECRET)), "demo/a", b"y")
    assert "401 unauthorized: the credentials refused" in str(err.value) and SECRET not in str(err.value)


def test_delete_refused_names_what_stays(fake: Fake, capfd: pytest.CaptureFixture[str]) -> None:
    fake.world.delete_refused = True
    reg = Registry(fake.host)
    assert reg.delete_manifest("demo/a", "sha256:" + "00" * 32) is False
    assert reg.refused == [f"{fake.host}/demo/a@sha256:{'00' * 32}"]
    assert "DELETE refused (405): " + reg.refused[0] + " could not be removed" in "".join(capfd.readouterr())
    fake.world.delete_refused = False  # a registry that deletes (404 here: nothing there) refuses nothing
    reg = Registry(fake.host)
    assert reg.delete_manifest("demo/a", "sha256:" + "00" * 32) is False and reg.refused == []


# ---------------------------------------------------------------- credentials per host


def docker_config(tmp_path: Path, doc: dict[str, object]) -> None:
    (tmp_path / "docker").mkdir(exist_ok=True)
    (tmp_path / "docker" / "config.json").write_text(json.dumps(doc))


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_release_credentials_go_to_their_host_only(tmp_path: Path, fake: Fake) -> None:
    other = Fake(World(auth="bearer"))
    try:
        fake.world.auth = "bearer"
        s = settings(tmp_path, BUILDER_REGISTRY_USERNAME="ci", BUILDER_REGISTRY_PASSWORD=SECRET)
        s = s.for_release(f"{fake.host}/demo/rel")
        put_blob(Registry.from_settings(fake.host, s), "demo/rel", b"x")
        put_blob(Registry.from_settings(other.host, s), "demo/base", b"y")
        sent = [a for _, _, a in other.world.seen] + [f"{m} {s}" for m, s in other.world.token_calls]
        assert all(b64(f"ci:{SECRET}") not in a for a in sent)
        assert Keychain(s).resolve(other.host) is None and Keychain(s).resolve(fake.host) is not None
        unowned = settings(tmp_path, BUILDER_REGISTRY_USERNAME="ci", BUILDER_REGISTRY_PASSWORD=SECRET)
        assert Keychain(unowned).resolve(fake.host) is None  # no release host known: sent nowhere
    finally:
        other.close()


def test_docker_config_auths_identity_token_and_hub_names(tmp_path: Path) -> None:
    docker_config(tmp_path, {"auths": {"registry.test:5443": {"auth": b64(f"ci:{SECRET}")},
                                       "https://index.docker.io/v1/": {"auth": b64("hubuser:hubpass")},
                                       "nvcr.io": {"identitytoken": "idtok"}}})
    keys = Keychain(settings(tmp_path))
    assert keys.resolve("registry.test:5443") == registry.Credential("ci", SECRET)
    assert keys.resolve("registry-1.docker.io") == registry.Credential("hubuser", "hubpass")
    assert keys.resolve("nvcr.io") == registry.Credential(identity_token="idtok")
    assert keys.resolve("ghcr.io") is None
    assert registry.api_host("docker.io") == "registry-1.docker.io"
    assert registry.split_repository("docker.io/ubuntu") == ("docker.io", "library/ubuntu")
    assert Registry.from_settings("docker.io", settings(tmp_path)).base == "https://registry-1.docker.io"
    assert registry.auth_config("nvcr.io", settings(tmp_path)) == {"identitytoken": "idtok"}
    assert SECRET not in repr(keys.resolve("registry.test:5443"))


def test_credential_helper_and_auth_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-fake"
    helper.write_text("#!/bin/sh\nread host\n[ \"$host\" = registry.test ] || { echo 'credentials not found in native "
                      "keychain'; exit 1; }\necho '{\"Username\": \"helped\", \"Secret\": \"helper-secret\"}'\n")
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    docker_config(tmp_path, {"credHelpers": {"registry.test": "fake"}})
    (tmp_path / "auth.json").write_text(json.dumps({"auths": {"quay.io": {"auth": b64("robot:quaypass")}}}))
    keys = Keychain(settings(tmp_path, REGISTRY_AUTH_FILE=str(tmp_path / "auth.json")))
    assert keys.resolve("registry.test") == registry.Credential("helped", "helper-secret")
    assert keys.resolve("quay.io") == registry.Credential("robot", "quaypass")
    (tmp_path / "auth.json").write_text("not json")
    with pytest.raises(BadInput, match="REGISTRY_AUTH_FILE .*auth.json: expected a containers auth.json"):
        Keychain(settings(tmp_path, REGISTRY_AUTH_FILE=str(tmp_path / "auth.json"))).resolve("quay.io")


# ---------------------------------------------------------------- TLS


def ca_and_server(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    """A test CA (ca.crt) and a server context whose certificate it signed, for 127.0.0.1."""
    import ipaddress

    now = datetime.now(UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "builder test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "registry")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - timedelta(hours=1)).not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False).sign(ca_key, hashes.SHA256()))
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem")
    return tmp_path / "ca.crt", context


def test_unknown_ca_is_named_and_certs_d_trusts_it(tmp_path: Path) -> None:
    ca, context = ca_and_server(tmp_path)
    server = Fake(World(), tls=context)
    try:
        s = settings(tmp_path, BUILDER_REGISTRY_CERTS_D=str(tmp_path / "certs.d"))
        with pytest.raises(InfraError) as err:  # planted: no CA anywhere
            Transport(server.host, None, TLS.for_host("registry.test:5443", s)).request("GET", "/v2/")
        line = str(err.value)
        assert "TLS certificate did not verify" in line and "certs.d/127.0.0.1" in line and "is it running" not in line
        (tmp_path / "certs.d" / "registry.test:5443").mkdir(parents=True)
        (tmp_path / "certs.d" / "registry.test:5443" / "ca.crt").write_bytes(ca.read_bytes())
        tls = TLS.for_host("registry.test:5443", s)
        assert Transport(server.host, None, tls).request("GET", "/v2/").status_code == 200
        folder = tmp_path / "certs.d" / "registry.test:5443"
        (folder / "client.cert").write_text("x")
        assert TLS.for_host("registry.test:5443", s).cert is None  # a .cert without its .key is no client certificate
        (folder / "client.key").write_text("y")
        assert TLS.for_host("registry.test:5443", s).cert == (str(folder / "client.cert"), str(folder / "client.key"))
        bundle = settings(tmp_path, SSL_CERT_FILE=str(ca))  # read through the settings
        assert Transport(server.host, None, TLS.for_host("other:1", bundle)).request("GET", "/v2/").status_code == 200
        insecure = settings(tmp_path, BUILDER_INSECURE_REGISTRIES="other:1")
        assert TLS.for_host("other:1", insecure).insecure and TLS.for_host("127.0.0.1:5000", s).scheme == "http"
        unverified = Transport(server.host, None, TLS.for_host("other:1", insecure))  # the CA known nowhere
        assert unverified.request("GET", "/v2/").status_code == 200  # and no warning (warnings fail a test)
    finally:
        server.close()


class EngineAPI:
    """The docker SDK's APIClient as pull_base uses it: images by reference, and every pull with its auth_config."""

    def __init__(self, local: set[str]) -> None:
        self.local, self.pulls = local, []  # type: set[str], list[tuple[str, dict[str, str] | None]]

    def inspect_image(self, ref: str) -> dict[str, str]:
        import docker.errors  # lazy: docker SDK, as the engine code

        if ref not in self.local:
            raise docker.errors.ImageNotFound(ref)
        return {"Id": "sha256:" + "0" * 64}

    def pull(self, name: str, tag: str, auth_config: dict[str, str] | None = None) -> None:
        self.pulls.append((f"{name}@{tag}", auth_config))
        self.local.add(f"{name}@{tag}")


def test_the_builds_base_pull_gets_its_own_hosts_credentials_only(tmp_path: Path) -> None:
    """FROM's base is pulled with the keychain's auth_config of the base's host: the release pair stays with the
    release host, another host's config.json entry stays with that host; a local base is not pulled at all."""
    from types import SimpleNamespace

    from builder.engine.basecontainer import pull_base

    docker_config(tmp_path, {"auths": {"base.test:5000": {"auth": b64("baseuser:basepass")},
                                       "other.test": {"auth": b64("other:otherpass")}}})
    s = settings(tmp_path, BUILDER_REGISTRY_USERNAME="ci", BUILDER_REGISTRY_PASSWORD=SECRET
                 ).for_release("rel.test:5443/demo/rel")
    digest = "@sha256:" + "1" * 64
    api = EngineAPI({"local.test/demo/base" + digest})
    client = SimpleNamespace(api=api)
    assert pull_base(client, "local.test/demo/base" + digest, s) and api.pulls == []  # the engine has it
    for host in ("base.test:5000", "rel.test:5443", "none.test"):
        assert pull_base(client, f"{host}/demo/base{digest}", s)
    assert api.pulls == [(f"base.test:5000/demo/base{digest}", {"username": "baseuser", "password": "basepass"}),
                         (f"rel.test:5443/demo/base{digest}", {"username": "ci", "password": SECRET}),
                         (f"none.test/demo/base{digest}", None)]


# ---------------------------------------------------------------- the cross-registry copy


def test_copy_streams_checks_skips_and_keeps_foreign_layers(tmp_path: Path) -> None:
    src, dst = Fake(World(auth="bearer")), Fake(World())
    try:
        source, target = Registry(src.host), Registry(dst.host)
        blobs = [{"digest": put_blob(source, "base", os.urandom(3 << 20)), "size": 3 << 20, "mediaType": "x"}
                 for _ in range(3)]
        foreign = {"digest": "sha256:" + "ab" * 32, "size": 9, "urls": ["https://example.invalid/l"],
                   "mediaType": "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"}
        lines: list[str] = []
        first = copy_blobs(source, "base", target, "rel", [*blobs, foreign], progress=lines.append)
        assert first["copied"] == 3 and first["foreign"] == 1 and first["bytes"] == 9 << 20 and len(lines) == 4
        again = copy_blobs(source, "base", target, "rel", blobs)
        assert again["present"] == 3 and again["bytes"] == 0  # a rerun moves 0 bytes
        claimed = "sha256:" + hashlib.sha256(b"other").hexdigest()
        bad = {"digest": claimed, "size": 5}
        src.world.blobs["base@" + claimed] = b"tampered"  # planted: the source serves other bytes
        with pytest.raises(PublishError):
            copy_blobs(source, "base", target, "rel", [bad])
        assert f"rel@{claimed}" not in dst.world.blobs
    finally:
        src.close()
        dst.close()
