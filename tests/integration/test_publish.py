"""Publish against real registries: the main one on 127.0.0.1:5000 and our own on 127.0.0.1:5001+
(read-only, stopped, with htpasswd auth, behind a proxy that tampers with manifest digests)."""
import hashlib
import http.client
import io
import json
import socket
import subprocess
import tarfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from builder.core.errors import BadInput, InfraError, PublishError
from builder.core.options import Settings
from builder.core.records import Report
from builder.engine import client as engine
from builder.engine.infra import Info
from builder.engine.registry import MANIFEST_TYPES, Registry, verify_tag
from builder.lock import record as lock_record
from builder.pipeline import releasing
from builder.report import document as report
from tests.fixture_types import DemoAccepted, DockerClient, MakeReportInputs

SETTINGS = Settings.from_env()

REGISTRY_BIN = "/usr/bin/docker-registry"
ANY = "sha256:" + "0" * 64
StartRegistry = Callable[..., tuple[str, "subprocess.Popen[bytes]"]]  # (readonly=, htpasswd=) -> (host:port, process)


# ---------------------------------------------------------------- helpers and fixtures


def free_port(start: int = 5001) -> int:
    for port in range(start, start + 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port on 127.0.0.1 from 5001")


def tiny_tar(text: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime = len(data), 946684800
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="session")
def tiny_images(docker_client: DockerClient) -> Iterator[dict[str, str]]:
    """Two tiny imported images (a, b): {name: image ID}; removed at the end of the session."""
    ids: dict[str, str] = {}
    for name in ("a", "b"):
        docker_client.api.import_image_from_data(tiny_tar(f"publish test image {name}\n"),
                                                 repository="builder-tests/tiny", tag=name)
        ids[name] = docker_client.images.get(f"builder-tests/tiny:{name}").id
    yield ids
    for image_id in ids.values():
        engine.remove_image(docker_client, image_id, force=True)  # False when already gone


def wait_answers(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).status_code in (200, 401):
                return
        except requests.RequestException:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


@pytest.fixture
def start_registry(tmp_path: Path) -> Iterator[StartRegistry]:
    """Factory: a docker-registry on 127.0.0.1:<free port >= 5001>; returns (host:port, process)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(readonly: bool = False, htpasswd: tuple[str, str] | None = None) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        storage = {"filesystem": {"rootdirectory": str(tmp_path / f"data{port}")}, "delete": {"enabled": True},
                   "maintenance": {"uploadpurging": {"enabled": False}, "readonly": {"enabled": readonly}}}
        config: dict[str, Any] = {"version": 0.1, "log": {"level": "warn"}, "storage": storage,
                                  "http": {"addr": f"127.0.0.1:{port}"}}
        if htpasswd:
            import warnings

            with warnings.catch_warnings():  # crypt is deprecated (removed in 3.13); bcrypt is not installed
                warnings.simplefilter("ignore", DeprecationWarning)
                import crypt
            user, password = htpasswd
            path = tmp_path / "htpasswd"
            path.write_text(f"{user}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")
            config["auth"] = {"htpasswd": {"realm": "tests", "path": str(path)}}
        (tmp_path / f"registry{port}.yml").write_text(json.dumps(config))
        proc = subprocess.Popen([REGISTRY_BIN, "serve", str(tmp_path / f"registry{port}.yml")],
                                stdout=open(tmp_path / f"registry{port}.log", "wb"), stderr=subprocess.STDOUT)
        procs.append(proc)
        wait_answers(f"http://127.0.0.1:{port}/v2/")
        return f"127.0.0.1:{port}", proc

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def read_chunked(rfile: io.BufferedIOBase) -> bytes:
    body = b""
    while True:
        size = int(rfile.readline().split(b";")[0].strip(), 16)
        if size == 0:
            rfile.readline()
            return body
        body += rfile.read(size)
        rfile.readline()


@pytest.fixture
def tamper_proxy() -> Iterator[Callable[[str, str], str]]:
    """Factory: an HTTP proxy on 127.0.0.1 in front of a registry that forwards everything but tampers with
    successful manifest HEAD/GET answers: mode 'header' (wrong Docker-Content-Digest), 'body' (other bytes,
    header kept), 'consistent' (other bytes with their own matching digest)."""
    servers: list[ThreadingHTTPServer] = []

    def start(upstream: str, mode: str) -> str:
        up_host, up_port = upstream.split(":")

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def forward(self) -> None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = read_chunked(self.rfile)
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                skip = ("transfer-encoding", "content-length", "connection")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                conn = http.client.HTTPConnection(up_host, int(up_port), timeout=60)
                conn.request(self.command, self.path, body=body if body or self.command in ("PUT", "POST", "PATCH")
                             else None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                out = {k: v for k, v in resp.getheaders() if k.lower() not in skip + ("date", "server")}
                length = resp.getheader("Content-Length", str(len(data)))
                if "/manifests/" in self.path and self.command in ("GET", "HEAD") and resp.status == 200:
                    if mode == "header":
                        out["Docker-Content-Digest"] = ANY
                    elif mode == "body" and self.command == "GET":
                        data = data + b"\n"
                    elif mode == "consistent":
                        if self.command == "GET":
                            data = data + b"\n"
                        fake = data if self.command == "GET" else conn_get(upstream, self.path, headers) + b"\n"
                        out["Docker-Content-Digest"] = "sha256:" + hashlib.sha256(fake).hexdigest()
                        length = str(len(fake))
                    if self.command == "GET":
                        length = str(len(data))
                conn.close()
                self.send_response(resp.status)
                for key, value in out.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = forward

        server = ThreadingHTTPServer(("127.0.0.1", free_port(5101)), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def conn_get(upstream: str, path: str, headers: dict[str, str]) -> bytes:
    host, port = upstream.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", path, headers=headers)
    data = conn.getresponse().read()
    conn.close()
    return data


def report_for(report_inputs: MakeReportInputs, outdir: Path, repository: str, image_id: str,
               client: DockerClient | None = None, tag_image: str | None = None, **kwargs: Any
               ) -> tuple[Report, dict[str, Path]]:
    """Write a report for image_id to outdir; tag tag_image (default image_id) with the report's SHA tag."""
    pins, sources, build, acceptance = report_inputs(repository=repository, image_id=image_id, **kwargs)
    rep = report.make_report(pins, lock_record.of(pins), sources, build, acceptance)
    paths = report.write(rep, outdir)
    if client is not None:
        client.images.get(tag_image or image_id).tag(repository, rep.tags[0])
    return rep, paths


def snapshot(paths: dict[str, Path]) -> dict[str, Any]:
    return {name: path.read_bytes() for name, path in paths.items()}


def served_digest(repository: str, tag: str, auth: tuple[str, str] | None = None) -> tuple[str, str]:
    """(Docker-Content-Digest of HEAD, sha256 of the GET bytes), straight from the registry."""
    host, _, name = repository.partition("/")
    accept = {"Accept": ", ".join(MANIFEST_TYPES)}
    url = f"http://{host}/v2/{name}/manifests/{tag}"
    head = requests.head(url, headers=accept, auth=auth, timeout=10)
    got = requests.get(url, headers=accept, auth=auth, timeout=10)
    return head.headers["Docker-Content-Digest"], "sha256:" + hashlib.sha256(got.content).hexdigest()


# ---------------------------------------------------------------- refusals (before any push)


def test_refuses_not_accepted_report(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    _, paths = report_for(report_inputs, tmp_path, "127.0.0.1:5000/tests/refused", "sha256:" + "ab" * 32,
                          statuses={"rl_step": "fail"})
    before = snapshot(paths)
    with pytest.raises(PublishError, match="verdict is NOT ACCEPTED; only an ACCEPTED image is published"):
        releasing.publish_report(paths["json"], SETTINGS)
    assert snapshot(paths) == before


def test_refuses_report_whose_gates_contradict_its_verdict(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    rep, paths = report_for(report_inputs, tmp_path, "127.0.0.1:5000/tests/refused", "sha256:" + "ab" * 32,
                            statuses={"control": None})
    forged = rep.model_copy(update={"verdict": "ACCEPTED", "reasons": []})
    paths["json"].write_text(forged.model_dump_json())
    with pytest.raises(BadInput, match="acceptance.gates.control: required gate reads not run"):
        releasing.publish_report(paths["json"], SETTINGS)  # builder/release/trust.py: exit 2, before any registry call


@pytest.mark.docker
def test_refuses_report_for_another_image(report_inputs: MakeReportInputs, tmp_path: Path, docker_client: DockerClient,
                                          tiny_images: dict[str, str], infra_setup: Info) -> None:
    repo = f"127.0.0.1:5000/tests/other-image-{uuid.uuid4().hex[:8]}"
    _, paths = report_for(report_inputs, tmp_path, repo, tiny_images["a"], docker_client, tag_image=tiny_images["b"])
    before = snapshot(paths)
    with pytest.raises(PublishError, match="the report accepted"):
        releasing.publish_report(paths["json"], SETTINGS, image="builder-tests/tiny:b")
    assert snapshot(paths) == before
    # a local tag of the same name moved by another run does not matter: publish goes by the accepted image ID
    receipt = releasing.publish_report(paths["json"], SETTINGS)
    assert receipt.config_digest == tiny_images["a"]


# ---------------------------------------------------------------- push and registry failures


@pytest.mark.docker
def test_push_to_read_only_registry_fails_without_receipt(report_inputs: MakeReportInputs, tmp_path: Path,
                                                          docker_client: DockerClient, tiny_images: dict[str, str],
                                                          start_registry: StartRegistry) -> None:
    host, _ = start_registry(readonly=True)
    _, paths = report_for(report_inputs, tmp_path, f"{host}/tests/readonly", tiny_images["a"], docker_client)
    before = snapshot(paths)
    # by digest through the registry API, to staging first: the read-only registry refuses the first upload
    with pytest.raises(PublishError, match=f"registry {host}: POST /v2/tests/readonly-staging/blobs/uploads/ answered"):
        releasing.publish_report(paths["json"], SETTINGS)
    assert snapshot(paths) == before
    assert report.load(paths["json"]).publish is None


@pytest.mark.docker
def test_stopped_registry_is_infra_error(report_inputs: MakeReportInputs, tmp_path: Path, docker_client: DockerClient,
                                         tiny_images: dict[str, str], start_registry: StartRegistry) -> None:
    host, proc = start_registry()
    proc.terminate()
    proc.wait(timeout=10)
    _, paths = report_for(report_inputs, tmp_path, f"{host}/tests/stopped", tiny_images["a"], docker_client)
    before = snapshot(paths)
    with pytest.raises(InfraError, match=f"registry {host}: unreachable") as err:
        releasing.publish_report(paths["json"], SETTINGS)
    assert err.value.exit_code == 3
    assert snapshot(paths) == before


@pytest.mark.docker
@pytest.mark.parametrize("mode, message", [
    ("header", "HEAD Docker-Content-Digest sha256:0000.* does not match the sha256 of the manifest bytes"),
    # the local image goes through staging, read back by digest there: a changed body is refused at that read
    ("body", "tampered-staging@sha256:[0-9a-f]{64} serves bytes hashing to sha256:"),
    ("consistent", "tampered-staging@sha256:[0-9a-f]{64} serves bytes hashing to sha256:"),
])
def test_digest_mismatch_is_refused(report_inputs: MakeReportInputs, tmp_path: Path, docker_client: DockerClient,
                                    tiny_images: dict[str, str],
                                    start_registry: StartRegistry,
                                    tamper_proxy: Callable[[str, str], str], mode: str, message: str) -> None:
    upstream, _ = start_registry()
    host = tamper_proxy(upstream, mode)
    _, paths = report_for(report_inputs, tmp_path, f"{host}/tests/tampered", tiny_images["a"], docker_client)
    before = snapshot(paths)
    with pytest.raises(PublishError, match=message):
        releasing.publish_report(paths["json"], SETTINGS)
    assert snapshot(paths) == before
    for tag in report_for_tags(paths):  # withdrawn: the registry itself no longer serves the tags
        assert requests.head(f"http://{upstream}/v2/tests/tampered/manifests/{tag}", timeout=10,
                             headers={"Accept": ", ".join(MANIFEST_TYPES)}).status_code == 404


def report_for_tags(paths: dict[str, Path]) -> list[str]:
    tags: list[str] = json.loads(paths["json"].read_text())["tags"]
    return tags


# ---------------------------------------------------------------- success


@pytest.mark.docker
def test_publish_pushes_verifies_and_records_receipt(report_inputs: MakeReportInputs, tmp_path: Path, docker_client: DockerClient,
                                                     tiny_images: dict[str, str],
                                                     infra_setup: Info) -> None:
    repo = "127.0.0.1:5000/tests/published"
    rep, paths = report_for(report_inputs, tmp_path, repo, tiny_images["a"], docker_client)
    receipt = releasing.publish_report(paths["json"], SETTINGS)
    head, computed = served_digest(repo, rep.tags[0])
    assert receipt.verified and receipt.digest == head == computed
    assert served_digest(repo, "demo") == (head, computed)
    assert receipt.config_digest == tiny_images["a"] != receipt.digest
    assert receipt.tags == rep.tags and receipt.platform == "linux/amd64"
    stored = report.load(paths["json"])
    assert stored.publish == receipt and stored.run_manifest.layers()["container"]["registry_digest"] == receipt.digest
    md = paths["md"].read_text()
    assert f"| `{receipt.digest}` |" in md and "### Publish receipt" in md
    assert "not published" not in md
    # the same verification refuses another config digest or another platform
    reg = Registry("127.0.0.1:5000")
    with pytest.raises(PublishError, match=f"manifest config {tiny_images['a']} is not image {tiny_images['b']}"):
        verify_tag(reg, "tests/published", "demo", receipt.digest, tiny_images["b"], "linux/amd64")
    with pytest.raises(PublishError, match="image platform linux/amd64, the report says linux/arm64"):
        verify_tag(reg, "tests/published", "demo", receipt.digest, tiny_images["a"], "linux/arm64")


@pytest.mark.docker
def test_platform_other_than_reported_gets_no_receipt(report_inputs: MakeReportInputs, tmp_path: Path,
                                                      docker_client: DockerClient, tiny_images: dict[str, str],
                                                      infra_setup: Info) -> None:
    repo = "127.0.0.1:5000/tests/platform"
    _, paths = report_for(report_inputs, tmp_path, repo, tiny_images["b"], docker_client, platform="linux/arm64")
    before = snapshot(paths)
    with pytest.raises(PublishError, match="image platform linux/amd64, the report says linux/arm64"):
        releasing.publish_report(paths["json"], SETTINGS)
    assert snapshot(paths) == before


@pytest.mark.docker
def test_credentials_never_leak(report_inputs: MakeReportInputs, tmp_path: Path, docker_client: DockerClient,
                                tiny_images: dict[str, str],
                                start_registry: StartRegistry, monkeypatch: pytest.MonkeyPatch,
                                capfd: pytest.CaptureFixture[str]) -> None:
    password = "planted-Secret-4711"
    host, _ = start_registry(htpasswd=("builder", password))
    monkeypatch.setenv("BUILDER_REGISTRY_USERNAME", "builder")
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", password)
    rep, paths = report_for(report_inputs, tmp_path / "ok", f"{host}/tests/auth", tiny_images["a"], docker_client)
    receipt = releasing.publish_report(paths["json"], Settings.from_env())
    assert receipt.digest == served_digest(f"{host}/tests/auth", rep.tags[0], auth=("builder", password))[1]
    # a wrong password fails with a masked message
    monkeypatch.setenv("BUILDER_REGISTRY_PASSWORD", "wrong-" + password)
    _, bad = report_for(report_inputs, tmp_path / "bad", f"{host}/tests/auth2", tiny_images["a"], docker_client)
    with pytest.raises(PublishError) as err:
        releasing.publish_report(bad["json"], Settings.from_env())
    assert password not in str(err.value) and "unauthorized" in str(err.value)
    out, errout = capfd.readouterr()
    texts = [out, errout, str(err.value), json.dumps(docker_client.api.inspect_image(tiny_images["a"]))]
    texts += [p.read_text() for p in list(paths.values()) + list(bad.values())]
    assert all(password not in text for text in texts)
    assert any("published" in text for text in texts)  # the capture did see publish's log


# ---------------------------------------------------------------- end to end on the demo image


@pytest.mark.docker
def test_demo_image_accepted_report_and_publish(demo_accepted: DemoAccepted, tmp_path: Path, docker_client: DockerClient) -> None:
    pins, sources, built, acceptance = demo_accepted
    rep = report.make_report(pins, lock_record.of(pins), sources, built, acceptance)
    assert rep.verdict == "ACCEPTED", rep.reasons
    assert rep.run_manifest.layers()["source"]["verl"]["commit_in_image"] == pins.components["verl"].commit
    assert rep.run_manifest.layers()["installed_packages"]["vllm"]["version"] != "unknown"
    paths = report.write(rep, tmp_path)
    receipt = releasing.publish_report(paths["json"], SETTINGS)
    head, computed = served_digest(pins.image.repository, rep.tags[0])
    assert receipt.digest == head == computed and receipt.config_digest == built.image_id
    stored = report.load(paths["json"])
    assert stored.publish == receipt and f"`{receipt.digest}`" in paths["md"].read_text()
    top = ET.parse(paths["junit"]).getroot()  # <testsuites>: one <testsuite> per suite of results.suites
    assert top.tag == "testsuites" and [s.get("name") for s in top.findall("testsuite")] == ["acceptance"]  # no .sqsh
    cases = top.findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == ["provenance", "zero_update", "rl_step", "control", "performance"]
    assert all(len(c.findall("failure") + c.findall("error") + c.findall("skipped")) == 0 for c in cases)
