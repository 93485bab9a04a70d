"""The lock's parallel downloads (builder/lock/download.py): which file of a release is taken for the
target, sha256 checked against the index, sdist-only releases told apart; and the time table."""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, cast

import pytest
import requests

from builder.core.options import Settings
from builder.lock import download, lockfile, resolver

TARGET = resolver.Target("3.11", "cp311", "x86_64", (2, 36))
RANKED = download.tags(TARGET.python, TARGET.abi, TARGET.platforms())


def f(name: str, requires: str | None = None) -> dict[str, Any]:
    return {"filename": name, "hashes": {"sha256": "0" * 64}, "requires-python": requires, "url": name}


def test_pick_takes_the_best_wheel_for_the_target() -> None:
    files = [f("x-1.0.tar.gz"), f("x-1.0-py3-none-any.whl"), f("x-1.0-cp311-abi3-manylinux_2_17_x86_64.whl"),
             f("x-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"), f("x-1.0-cp311-cp311-macosx_11_0_arm64.whl"),
             f("x-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"), f("x-2.0-cp311-cp311-manylinux_2_28_x86_64.whl")]
    def picked(some: list[dict[str, Any]]) -> str:
        best = download.pick(some, "1.0", RANKED, "3.11")
        assert best is not None
        return str(best["filename"])

    assert picked(files) == "x-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert picked(files[:3]) == "x-1.0-cp311-abi3-manylinux_2_17_x86_64.whl"
    assert picked(files[:2]) == "x-1.0-py3-none-any.whl"


def test_pick_refuses_other_platforms_newer_glibc_and_requires_python() -> None:
    assert download.pick([f("x-1.0-cp311-cp311-manylinux_2_39_x86_64.whl")], "1.0", RANKED, "3.11") is None
    assert download.pick([f("x-1.0-cp311-cp311-manylinux_2_28_aarch64.whl")], "1.0", RANKED, "3.11") is None
    assert download.pick([f("x-1.0-py3-none-any.whl", ">=3.12")], "1.0", RANKED, "3.11") is None
    assert download.pick([f("x-1.0-py3-none-any.whl", ">=3.10")], "1.0", RANKED, "3.11") is not None
    assert download.pick([{"filename": "x-1.0-py3-none-any.whl", "hashes": {}}], "1.0", RANKED, "3.11") is None


def test_has_sdist_only_for_that_version() -> None:
    assert download.has_sdist([f("antlr4-python3-runtime-4.9.3.tar.gz")], "4.9.3")
    assert not download.has_sdist([f("antlr4-python3-runtime-4.9.2.tar.gz")], "4.9.3")


class FakeResponse:
    def __init__(self, body: bytes, files: list[dict[str, Any]] | None = None,
                 url: str = "https://index.invalid/simple/x/") -> None:
        self.body, self.files, self.url = body, files, url
        self.status_code, self.headers = 200, {"content-type": download.JSON}

    def json(self) -> dict[str, Any]:
        return {"files": self.files}

    def raise_for_status(self) -> None:
        pass

    def iter_content(self, size: int) -> Iterator[bytes]:
        yield self.body

    def __enter__(self) -> FakeResponse:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


class FakeSession:
    def __init__(self, body: bytes, listed_sha: str) -> None:
        self.body, self.listed = body, listed_sha

    def get(self, url: str, **kwargs: Any) -> FakeResponse:
        if url.endswith("/x/"):
            return FakeResponse(b"", [{"filename": "x-1.0-py3-none-any.whl", "hashes": {"sha256": self.listed},
                                       "url": "x-1.0-py3-none-any.whl"}])
        return FakeResponse(self.body)


@pytest.mark.parametrize("honest", [True, False])
def test_a_download_enters_the_pool_only_with_the_sha256_the_index_lists(tmp_path: Path, honest: bool) -> None:
    body = b"wheel bytes"
    listed = hashlib.sha256(body if honest else b"something else").hexdigest()
    settings = Settings.from_env({"BUILDER_CACHE": str(tmp_path)})
    got = download._one(cast(requests.Session, FakeSession(body, listed)), settings, "x", "1.0", RANKED, "3.11", tmp_path)
    if honest:
        assert got == tmp_path / "x-1.0-py3-none-any.whl" and got.read_bytes() == body
    else:
        assert got is None
    assert sorted(p.name for p in tmp_path.iterdir()) == (["x-1.0-py3-none-any.whl"] if honest else [])


def test_metadata_cache_key_follows_commit_base_and_build_requirements() -> None:
    class Pin:
        class install:
            pip_args: list[Any] = []

    class Pins:
        class base:
            image = "b@sha256:" + "1" * 64
        components = {"verl": Pin}

    class Comp:
        export_sha256 = "e" * 64

    settings = Settings.from_env({"BUILDER_CACHE": str(Path("/tmp") / "unused-lock-cache-key")})
    a = lockfile.ComponentInputs("verl", "verl", build_requires=["setuptools>=61"])
    b = lockfile.ComponentInputs("verl", "verl", build_requires=["setuptools>=70"])
    key = lockfile.metadata_cache  # stand-ins with only the fields the key reads
    assert key(settings, Pins, Comp, a) == key(settings, Pins, Comp, a)  # type: ignore[arg-type]
    assert key(settings, Pins, Comp, a) != key(settings, Pins, Comp, b)  # type: ignore[arg-type]


def test_time_table_puts_downloads_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolver, "SPENT", {"resolve (uv)": 3.0, "wheels: pool and downloads": 12.0})
    monkeypatch.setattr(download, "TOTALS", download.Totals(seconds=10.0, bytes=500_000_000, files=100))
    rows = {" ".join(line.split()[:-2]): line.split()[-2] for line in lockfile.time_table(20.0).splitlines()[1:]
            if line.endswith(" s")}
    assert rows["total without downloads"] == "10.00" and rows["total"] == "20.00"
    assert rows["wheels: pool (downloads apart)"] == "2.00" and rows["other"] == "5.00"
    assert re.search(r"^  downloads +10\.00 s  100 wheels, 500\.0 MB", lockfile.time_table(20.0), re.M)


def test_older_manylinux_counts_as_pip_reads_manylinux2014() -> None:
    old = f("py_spy-0.4.3-py2.py3-none-manylinux_2_5_x86_64.manylinux1_x86_64.whl")
    assert download.pick([old], "0.4.3", RANKED, "3.11") is old
    assert download.expand(["manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"])[-3:] == \
        ["manylinux_2_5_x86_64", "manylinux1_x86_64", "linux_x86_64"]
