"""The lock's wheel pool holds every platform's wheels (builder/lock/resolver.py): a wheel serves a lock only when one
of its tags is the target's, so an x86_64 cmake never lands in an aarch64 lock (seen: `make demo-arm64`'s lock took
the amd64 lock's cmake from the pool and the emulated metadata build refused it)."""
from __future__ import annotations

from pathlib import Path

from packaging.tags import Tag

from builder.lock import download, resolver

X86 = "cmake-4.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
ARM = "cmake-4.4.5-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"
PURE = "ninja_syntax-1.7.2-py2.py3-none-any.whl"


def supported(machine: str) -> set[Tag]:
    target = resolver.Target(python="3.11", abi="cp311", machine=machine, glibc=(2, 36))
    return set(download.tags(target.python, target.abi, target.platforms()))


def test_a_wheel_for_another_machine_is_not_the_targets(tmp_path: Path) -> None:
    (tmp_path / X86).write_bytes(b"")
    (tmp_path / PURE).write_bytes(b"")
    assert resolver._pool_match(tmp_path, "cmake", "4.4.5", True, supported("x86_64")) == tmp_path / X86
    assert resolver._pool_match(tmp_path, "cmake", "4.4.5", True, supported("aarch64")) is None
    assert resolver._pool_match(tmp_path, "ninja-syntax", "1.7.2", True, supported("aarch64")) == tmp_path / PURE
    (tmp_path / ARM).write_bytes(b"")
    assert resolver._pool_match(tmp_path, "cmake", "4.4.5", True, supported("aarch64")) == tmp_path / ARM
