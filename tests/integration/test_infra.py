"""Local infrastructure (engine, registry) and the demo base image."""
import io
import re
import socket
import tarfile
from pathlib import Path

import pytest

from builder.core import files as fs
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.engine import infra
from builder.engine.infra import Info
from builder.lock import record as lock_record
from builder.lock import wheels
from demo import baseimage
from demo.prepare import write_local_pins
from tests.fixture_types import DockerClient

SETTINGS = Settings.from_env()

DIGEST_REF = re.compile(r"^127\.0\.0\.1:5000/demo/base@sha256:[0-9a-f]{64}$")


@pytest.mark.docker
def test_setup_is_idempotent(infra_setup: Info) -> None:
    again = infra.ensure_all(SETTINGS)
    assert again["engine"]["engine"] == "found"
    assert again["registry"]["registry"] == "found"
    assert again["engine"]["pid"] is None or again["engine"]["pid"] == infra_setup["engine"].get("pid")


@pytest.mark.docker
def test_registry_answers_on_loopback_only(infra_setup: Info) -> None:
    assert infra.registry_url() == "127.0.0.1:5000"
    assert infra.registry_answers()
    listeners = infra.tcp_listeners(5000)
    assert listeners and set(listeners) <= {"127.0.0.1", "::1"}, listeners
    # not reachable through any other local address
    for addr in _non_loopback_ipv4():
        with socket.socket() as sock:
            sock.settimeout(2)
            assert sock.connect_ex((addr, 5000)) != 0, f"registry reachable on {addr}:5000"


def _non_loopback_ipv4() -> list[str]:
    """Local IPv4 addresses other than 127/8 (the LOCAL /32 host entries of /proc/net/fib_trie)."""
    addrs: set[str] = set()
    last: str | None = None
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        match = re.search(r"\|-- (\d+\.\d+\.\d+\.\d+)$", line)
        if match:
            last = match.group(1)
        elif "/32 host LOCAL" in line and last:
            addrs.add(last)
    return sorted(a for a in addrs if not a.startswith("127."))


def test_recipe_hash_is_stable() -> None:
    first, second = baseimage.recipe_hash(SETTINGS), baseimage.recipe_hash(SETTINGS)
    assert first == second
    assert re.fullmatch(r"[0-9a-f]{64}", first)


def test_lock_parser_requires_hashes(tmp_path: Path) -> None:
    assert wheels.parse_lock("a==1 --hash=sha256:" + "0" * 64 + "  # c\n") == [wheels.LockEntry("a", "1", ("0" * 64,))]
    with pytest.raises(BadInput):
        wheels.parse_lock("a==1\n")
    with pytest.raises(BadInput):
        wheels.parse_lock("a>=1 --hash=sha256:" + "0" * 64 + "\n")


def test_wheel_target_comes_from_the_pins_base() -> None:
    target = wheels.Target.from_base("3.12", "linux/arm64")
    args = target.pip_args()
    assert args[args.index("--python-version") + 1] == "3.12" and "cp312" in args
    assert "manylinux_2_28_aarch64" in args and not any("x86_64" in a for a in args)
    with pytest.raises(BadInput, match="base.platform"):
        wheels.Target.from_base("3.12", "windows/amd64")


def test_demo_lock_wheels_verified() -> None:
    lock = Path(__file__).resolve().parents[2] / "pins" / "locks" / "demo.lock"
    target = wheels.Target.from_base("3.11", "linux/amd64")
    locked = lock_record.load(lock)
    house = wheels.ensure_wheels(lock, locked.text, locked.wheel_key, target, SETTINGS)
    entries = wheels.parse_lock(lock.read_text())
    hashes = {fs.sha256_file(p) for p in house.iterdir() if p.is_file()}
    for entry in entries:
        assert hashes & set(entry.hashes), entry.name
    assert wheels.ensure_wheels(lock, locked.text, locked.wheel_key, target, SETTINGS) == house  # reused


def test_local_demo_pins_carry_the_digest_and_leave_the_example_alone(tmp_path: Path) -> None:
    from builder.pins import model as pins_mod
    from demo.prepare import PINS

    before = PINS.read_text()
    ref = "127.0.0.1:5000/demo/base@sha256:" + "a" * 64
    out = write_local_pins(ref, out=PINS.parent / f".test-{tmp_path.name}.yaml")
    try:
        loaded = pins_mod.load(out)
        assert loaded.base.image == ref and loaded.name == pins_mod.load(PINS).name
    finally:
        out.unlink()
    assert PINS.read_text() == before


@pytest.mark.docker
def test_base_image_is_a_digest_with_torch(docker_client: DockerClient, base_image: str) -> None:
    assert DIGEST_REF.match(base_image), base_image
    image = docker_client.images.get(base_image)  # resolves locally, no pull
    assert image.labels[baseimage.RECIPE_LABEL] == baseimage.recipe_hash(SETTINGS)
    out = docker_client.containers.run(
        base_image, ["/opt/venv/bin/python", "-c", "import sys, torch; print(torch.__version__, torch.__file__, sys.prefix)"],
        network_mode="none", remove=True)
    version, path, prefix = out.decode().split()
    assert version.startswith("2.13.0"), version
    assert path.startswith("/opt/venv/") and prefix == "/opt/venv"


@pytest.mark.docker
def test_base_image_is_cached(base_image: str) -> None:
    assert baseimage.ensure_base_image(SETTINGS) == base_image


@pytest.mark.docker
def test_from_digest_builds_without_network(docker_client: DockerClient, base_image: str) -> None:
    dockerfile = f"FROM {base_image}\nRUN [\"/opt/venv/bin/python\", \"-c\", \"import setuptools, wheel\"]\n".encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    buf.seek(0)
    image, _logs = docker_client.images.build(fileobj=buf, custom_context=True, network_mode="none",
                                              pull=False, rm=True, forcerm=True)
    docker_client.images.remove(image.id)
