"""The registry door against real Debian `docker-registry` processes (distribution 2.8): (a) TLS from a test CA with
htpasswd, (b) TLS with `auth.token` from a token service here that signs JWTs the registry checks through its
`rootcertbundle`, (c) a plain second registry for a base on another registry. They are reached as `registry.test`,
a name an /etc/hosts line (added and removed here) resolves to loopback, so the tool's own TLS is what is tested.
Each refusal is one line naming the host, and nothing is published; an expired token is renewed."""
from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import socket
import subprocess
import sys
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

from builder.core.errors import PublishError
from builder.core.imageref import ImageRef
from builder.core.options import Settings
from builder.engine.registry import Registry, copy_blobs, push_blob, put_manifest, verify_tag
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.pipeline import releasing
from builder.release import attest, dsse
from builder.report import document
from demo.prepare import variant_pins
from tests.faultstack import REGISTRY_BIN, free_port, wait_for
from tests.fixture_types import DemoImage, DockerClient

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
        # stale_first: a repository scope's first token has expired already (the registry refuses it: renewed);
        # refuse_repeat: a scope asked for again is refused (a refused renewal)
        self.stale_first, self.refuse_repeat, self.issued = False, False, set()  # type: bool, bool, set[str]
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
        stale = self.stale_first and bool(scope) and scope not in self.issued
        self.issued.add(scope)
        claims = {"iss": "test-issuer", "sub": account, "aud": NAME, "exp": now + (-120 if stale else self.exp_offset),
                  "nbf": now - 180, "iat": now - 180, "jti": uuid.uuid4().hex, "access": access}
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
                scope = query.get("scope", [""])[0]
                repeat = service.refuse_repeat and bool(scope) and scope in service.issued
                if self.headers.get("Authorization") != good or service.refuse or repeat:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"token": service.jwt(scope, USER),
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


def test_tls_htpasswd_publishes_with_certs_d_or_a_ca_bundle(world: dict[str, Any]) -> None:
    """The test CA from certs.d, or from BUILDER_REGISTRY_CA_BUNDLE alone (the refusals: the CLI cases below)."""
    host = f"{NAME}:{world['ports']['a']}"
    assert publish(Registry.from_settings(host, settings(world, host)), "demo/rel", "ok").startswith("sha256:")
    named = settings(world, host, BUILDER_REGISTRY_CA_BUNDLE=str(world["ca"]), BUILDER_REGISTRY_CERTS_D="/nonexistent")
    publish(Registry.from_settings(host, named), "demo/bundle", "ok")


def test_token_auth_one_token_per_scope_renewed_between_requests(world: dict[str, Any]) -> None:
    """One token per scope, cached; a token that expires between two requests of a publish is renewed (the
    refusals, pull-only and a refused renewal: the CLI cases below)."""
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


# ---------------------------------------------------------------- the CLI: builder run, publish, verify; skopeo

ROOT = Path(__file__).resolve().parents[2]
PASSPHRASE = "planted-Key-Passphrase-5150"


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


def skopeo(world: dict[str, Any], host: str, docker: Path, *args: str) -> bytes:
    """skopeo, an independent client, with the same credentials (the config.json as its authfile) and CA."""
    cmd = ["skopeo", *args[:1], f"--authfile={docker / 'config.json'}", f"--cert-dir={world['certs_d']}/{host}",
           *args[1:]]
    return subprocess.run(cmd, capture_output=True, check=True, timeout=60).stdout


def config_only(world: dict[str, Any], docker: Path, auths: dict[str, tuple[str, str]]) -> dict[str, str]:
    """The CLI's environment with the credentials only in a Docker config.json (DOCKER_CONFIG): no
    BUILDER_REGISTRY_*; the private CA in a certs.d; the signing key's passphrase."""
    docker.mkdir(parents=True, exist_ok=True)
    entries = {host: {"auth": base64.b64encode(f"{u}:{p}".encode()).decode()} for host, (u, p) in auths.items()}
    (docker / "config.json").write_text(json.dumps({"auths": entries}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUILDER_REGISTRY_", "REGISTRY_AUTH_FILE"))}
    return {**env, "DOCKER_CONFIG": str(docker), "BUILDER_REGISTRY_CERTS_D": str(world["certs_d"]),
            "BUILDER_KEY_PASSPHRASE": PASSPHRASE}


@pytest.fixture(scope="module")
def released(world: dict[str, Any], demo_image: DemoImage, docker_client: DockerClient,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`builder run --publish` of the demo's build inputs to the TLS + token registry (b), the base on 127.0.0.1:5000,
    credentials only in config.json, an encrypted P-256 key: the build is the session's demo image (a cache hit),
    acceptance on the provenance gate alone (the gates' own tests are elsewhere)."""
    folder = tmp_path_factory.mktemp("released")
    host = f"{NAME}:{world['ports']['b']}"

    def edit(data: dict[str, Any]) -> None:
        data["image"]["repository"] = f"{host}/demo/unified"
        data["acceptance"].pop("performance", None)
        data["acceptance"]["required_gates"] = ["provenance"]

    pins = variant_pins(folder / "pins", edit=edit, pins_path=demo_image[0].path, share_cache=True)
    key = folder / "signing.key"
    public, _ = releasing.keygen(key, kind="ecdsa-p256", passphrase=PASSPHRASE)
    env = config_only(world, folder / "docker", {host: (USER, PASSWORD)})
    started = time.monotonic()
    run = cli("run", str(pins), "--publish", "--key", str(key), "--out", str(folder / "run"), env=env)
    yield {"host": host, "pins": pins, "key": key, "public": public, "env": env, "docker": folder / "docker",
           "run": run, "dir": folder / "run", "seconds": time.monotonic() - started}
    staged = f"{host}/demo/unified-staging@{demo_image[3].manifest_digest}"  # acceptance's pull named it so
    with contextlib.suppress(Exception):  # the name only: the demo image keeps its tags
        docker_client.api.remove_image(staged, noprune=True)


def test_builder_run_publishes_through_tls_and_tokens_with_only_a_docker_config(
        world: dict[str, Any], released: dict[str, Any]) -> None:
    """The demo's `builder run --publish`: TLS from the test CA, token auth, the base on another registry (its
    layers copied), credentials only in config.json; ACCEPTED, published, `builder verify` passes, and skopeo reads
    the image and its referrers (the referrers tag schema's index of the three attestations)."""
    run, host = released["run"], released["host"]
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((released["dir"] / "report.json").read_text())
    assert report["verdict"] == "ACCEPTED" and report["publish"]["verified"], report["reasons"]
    assert "base blobs" in run.stderr  # the base's layers came from 127.0.0.1:5000
    digest, tag = report["publish"]["digest"], report["tags"][0]
    checked = cli("verify", f"{host}/demo/unified:{tag}", "--key", str(released["public"]), env=released["env"])
    assert checked.returncode == 0 and f"VERIFIED {host}/demo/unified@{digest}" in checked.stdout, checked.stderr
    seen = skopeo(world, host, released["docker"], "inspect", "--raw", f"docker://{host}/demo/unified:{tag}")
    assert "sha256:" + hashlib.sha256(seen).hexdigest() == digest
    listed = json.loads(skopeo(world, host, released["docker"], "list-tags", f"docker://{host}/demo/unified"))
    referrers = f"sha256-{digest.removeprefix('sha256:')}"  # the referrers tag schema (distribution 2.8)
    assert referrers in listed["Tags"] and tag in listed["Tags"], listed
    index = json.loads(skopeo(world, host, released["docker"], "inspect", "--raw",
                              f"docker://{host}/demo/unified:{referrers}"))
    assert len(index["manifests"]) == 3, index  # provenance, SBOM, test result
    for artifact in index["manifests"]:
        body = json.loads(skopeo(world, host, released["docker"], "inspect", "--raw",
                                 f"docker://{host}/demo/unified@{artifact['digest']}"))
        assert body["subject"]["digest"] == digest and artifact["artifactType"] == body["artifactType"]
    files = [p for p in released["dir"].rglob("*") if p.is_file()]
    assert all(PASSWORD not in p.read_text(errors="replace") and PASSPHRASE not in p.read_text(errors="replace")
               for p in files) and PASSWORD not in run.stderr + run.stdout


def case_report(released: dict[str, Any], folder: Path, repository: str, staged: str | None = None) -> Path:
    """The run's ACCEPTED report again, for another release repository: a pins file of its own that names it, the
    run's build and acceptance (`staged`: the same digest in another registry's staging repository), the acceptance
    signed again by the run's key. Returns its report.json."""
    assert released["run"].returncode == 0, released["run"].stderr[-2000:]  # the run's own test says more

    def edit(data: dict[str, Any]) -> None:
        data["image"]["repository"] = repository

    pins = pins_mod.load(variant_pins(folder / "pins", edit=edit, pins_path=released["pins"], share_cache=True))
    run = document.load(released["dir"] / "report.json")
    sources = run.sources.model_copy(update={"pins_path": str(pins.path), "pins_sha256": pins.sha256})
    build, acceptance = run.build, run.acceptance
    assert build is not None and acceptance is not None and acceptance.pulled is not None
    if staged:
        ref = ImageRef(staged)
        build = build.model_copy(update={"staged": ref})
        acceptance = acceptance.model_copy(update={"pulled": acceptance.pulled.model_copy(update={"ref": ref})})
    report = document.make_report(pins, lock_record.of(pins), sources, build, acceptance)
    assert report.verdict == "ACCEPTED", report.reasons
    document.write(report, folder / "run")
    attest.sign_acceptance(report, pins, dsse.load_private(released["key"], PASSPHRASE), folder / "run")
    return folder / "run" / "report.json"


def verified_and_read(world: dict[str, Any], released: dict[str, Any], env: dict[str, str], report_json: Path) -> None:
    """`builder verify` passes on what the report's publish put there, and skopeo reads the same manifest."""
    report = json.loads(report_json.read_text())
    repository, digest = report["repository"], report["publish"]["digest"]
    host = repository.split("/", 1)[0]
    checked = cli("verify", f"{repository}:{report['tags'][0]}", "--key", str(released["public"]), env=env)
    assert checked.returncode == 0 and f"VERIFIED {repository}@{digest}" in checked.stdout, checked.stderr[-2000:]
    seen = skopeo(world, host, Path(env["DOCKER_CONFIG"]), "inspect", "--raw", f"docker://{repository}:demo")
    assert "sha256:" + hashlib.sha256(seen).hexdigest() == digest


def test_builder_publish_renews_expired_tokens_and_publishes_with_htpasswd(
        world: dict[str, Any], released: dict[str, Any], tmp_path: Path) -> None:
    """`builder publish` of the run's report to two more release repositories: on the token registry with each
    repository scope's first token expired on arrival (refused by the registry, renewed, the publish succeeds), and on
    the TLS + htpasswd registry (the same digest copied to its staging repository by the tool's copy first). Each
    passes `builder verify` and skopeo reads it."""
    a_host, b_host, tokens = f"{NAME}:{world['ports']['a']}", released["host"], world["tokens"]
    env = config_only(world, tmp_path / "docker", {a_host: (USER, PASSWORD), b_host: (USER, PASSWORD)})
    renewed = case_report(released, tmp_path / "renewed", f"{b_host}/demo/renewed")
    calls, tokens.stale_first = tokens.calls, True
    try:
        out = cli("publish", str(renewed), "--key", str(released["key"]), env=env)
    finally:
        tokens.stale_first = False
    assert out.returncode == 0, out.stderr[-3000:]
    assert tokens.calls - calls >= 4  # planted: without the renewal the first refused token fails the publish
    verified_and_read(world, released, env, renewed)
    b, a = (Registry.from_settings(h, settings(world, h)) for h in (b_host, a_host))
    digest = json.loads(renewed.read_text())["publish"]["digest"]
    body = b.manifest_by_digest("demo/unified-staging", digest)
    doc = json.loads(body)
    copy_blobs(b, "demo/unified-staging", a, "demo/unified-staging", [*doc["layers"], doc["config"]])
    put_manifest(a, "demo/unified-staging", digest, body, doc["mediaType"])
    basic = case_report(released, tmp_path / "basic", f"{a_host}/demo/unified", f"{a_host}/demo/unified-staging@{digest}")
    out = cli("publish", str(basic), "--key", str(released["key"]), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    verified_and_read(world, released, env, basic)


FAILURES = {  # case: (registry, what to plant, exit code, what the one line says)
    "wrong password": ("a", "password", 1, "the credentials refused; check the credentials for"),
    "no credentials": ("b", "none", 1, "refused a token (401); no credentials for"),
    "pull-only token": ("b", "grant", 1, "refused; check the credentials for"),
    "refused renewal": ("b", "renewal", 1, "token service"),
    "unknown CA": ("a", "certs.d", 3, "TLS certificate did not verify"),
    "unverified host": ("c", "", 3, "or name the host in BUILDER_INSECURE_REGISTRIES"),
}


@pytest.mark.parametrize("case", FAILURES)
def test_builder_publish_refusal_is_one_line_and_publishes_nothing(
        world: dict[str, Any], released: dict[str, Any], tmp_path: Path, case: str) -> None:
    """Each bad credential or certificate: `builder publish` prints one error line naming the host and what to do,
    exits with the documented code (docs/registries.md), and the registry holds nothing of the release repository:
    no tag, no manifest (read back with good credentials)."""
    kind, plant, code, says = FAILURES[case]
    host, tokens = f"{NAME}:{world['ports'][kind]}", world["tokens"]
    slug = case.replace(" ", "-").lower()
    creds = (USER, "wrong-" + PASSWORD) if plant == "password" else (USER, PASSWORD)
    env = config_only(world, tmp_path / "docker", {} if plant == "none" else {host: creds})
    if plant == "certs.d":
        env["BUILDER_REGISTRY_CERTS_D"] = str(tmp_path / "no-ca-here")
    report_json = case_report(released, tmp_path / "case", f"{host}/demo/{slug}")
    digest = json.loads(report_json.read_text())["build"]["manifest_digest"]
    tokens.grant = "pull" if plant == "grant" else "pull,push"
    tokens.stale_first = tokens.refuse_repeat = plant == "renewal"
    try:
        out = cli("publish", str(report_json), "--key", str(released["key"]), env=env)
    finally:
        tokens.grant, tokens.stale_first, tokens.refuse_repeat = "pull,push", False, False
    errors = [line for line in out.stderr.splitlines() if line.startswith(("error", "Error", "Traceback"))]
    assert out.returncode == code and len(errors) == 1, (out.returncode, out.stderr[-3000:])
    assert host in errors[0] and says in errors[0] and "is it running" not in errors[0], errors[0]
    assert PASSWORD not in out.stderr + out.stdout
    reader = Registry.from_settings(host, settings(world, host)) if kind != "c" else Registry(f"127.0.0.1:{world['ports']['c']}")
    assert reader.tags(f"demo/{slug}") == [] and reader.tag_digest(f"demo/{slug}", digest) is None  # nothing published


def test_no_secret_in_the_registries_logs_or_files(world: dict[str, Any], released: dict[str, Any],
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """After the publishes above (and their refusals): the password and the key's passphrase are in no registry or
    token log, cache file, report, run log or printed line."""
    host = f"{NAME}:{world['ports']['a']}"
    publish(Registry.from_settings(host, settings(world, host)), "demo/grep", "ok")
    files = [p for folder in (world["folder"], released["dir"]) for p in folder.rglob("*")
             if p.is_file() and p.name != "htpasswd" and p.stat().st_size < 1 << 20]
    texts = [p.read_bytes().decode("utf-8", "replace") for p in files] + list(capfd.readouterr())
    texts += [released["run"].stdout, released["run"].stderr]
    assert len(files) >= 8 and all(PASSWORD not in text and PASSPHRASE not in text for text in texts)
