"""The suite's ELF reader (acceptance/elf.py): a loaded library's DT_NEEDED names and the CUDA targets of its fatbin
entries, on ELF files made here (the demo's torch is CPU-only) and on this host's interpreter."""
import os
import struct
import sys
from pathlib import Path

from acceptance import elf

CUBIN, PTX = 2, 1


def _entry(kind: int, arch: int, flags: int = 0, payload: bytes = b"\0" * 24) -> bytes:
    """One fatbin entry: a 64-byte header (kind, header size, payload size, ..., arch at +28, flags at +40)."""
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(payload), 0, 0, 8, 1, arch, 0, 0, flags, 0, 0)
    return head + payload


def _fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", elf.FATBIN_MAGIC, 1, 16, len(body)) + body


def _elf(sections: list[tuple[bytes, bytes, int]]) -> bytes:
    """A 64-bit little-endian ELF holding `sections` ([(name, data, sh_link)]) after the null section, with a
    .shstrtab; no program headers (the reader needs none)."""
    names = b"\0" + b"".join(n + b"\0" for n, _, _ in sections) + b".shstrtab\0"
    blobs = [d for _, d, _ in sections] + [names]
    offsets, at = [], 64
    for blob in blobs:
        offsets.append(at)
        at += len(blob) + (-len(blob) % 8)
    shoff = at
    head = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    head += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(blobs) + 1, len(blobs))
    body = b"".join(b + b"\0" * (-len(b) % 8) for b in blobs)
    table = b"\0" * 64
    name_at = 1
    for (name, data, link), offset in zip([*sections, (b".shstrtab", names, 0)], offsets):
        table += struct.pack("<IIQQQQIIQQ", name_at, 1, 0, 0, offset, len(data), link, 0, 1, 0)
        name_at += len(name) + 1
    return head + body + table


def _library(tmp_path: Path, fatbins: bytes | None = None) -> Path:
    strings = b"\0libcudart.so.13\0libc10.so\0"
    dynamic = struct.pack("<qQqQqQqQ", elf.DT_NEEDED, 1, 14, 5, elf.DT_NEEDED, 17, elf.DT_NULL, 0)  # 14: DT_SONAME
    sections = [(b".dynstr", strings, 0), (b".dynamic", dynamic, 1)]  # .dynamic links section 1, .dynstr
    if fatbins is not None:
        sections.append((b".nv_fatbin", fatbins, 0))
    path = tmp_path / "libkernels.so"
    path.write_bytes(_elf(sections))
    return path


def test_needed_names_from_the_dynamic_section(tmp_path: Path) -> None:
    assert elf.needed(str(_library(tmp_path))) == ["libcudart.so.13", "libc10.so"]
    assert "libc.so.6" in elf.needed(os.path.realpath(sys.executable))  # a real one: this host's interpreter


def test_cuda_targets_of_every_fatbin_entry(tmp_path: Path) -> None:
    """Two fatbins in the section (8-byte padding between them): cubins for sm_80 and sm_90a (the
    architecture-specific flag), PTX for compute_90; each target once, by number."""
    first = _fatbin(_entry(CUBIN, 80), _entry(PTX, 90))
    second = _fatbin(_entry(CUBIN, 90, flags=elf.ARCH_SPECIFIC | 0x8011), _entry(CUBIN, 80))
    path = _library(tmp_path, first + b"\0" * 8 + second)
    assert elf.cuda_arches(str(path)) == ["sm_80", "compute_90", "sm_90a"]
    assert elf.cuda_arches(str(_library(tmp_path))) == []  # no .nv_fatbin: CPU code only


def test_what_is_no_elf_or_is_cut_short_reads_as_nothing(tmp_path: Path) -> None:
    whole = _library(tmp_path, _fatbin(_entry(CUBIN, 80))).read_bytes()
    for name, data in {"text": b"#!/bin/sh\n", "empty": b"", "cut": whole[:200], "elf32": whole[:4] + b"\1" + whole[5:]
                       }.items():
        (tmp_path / name).write_bytes(data)
        assert elf.needed(str(tmp_path / name)) == [] and elf.cuda_arches(str(tmp_path / name)) == [], name
    assert elf.needed(str(tmp_path / "missing.so")) == []


def test_each_owned_library_gets_its_deps_once(tmp_path: Path) -> None:
    lib = str(_library(tmp_path, _fatbin(_entry(CUBIN, 90))))
    listed = [{"pid": 1, "library_sha256": {lib: "a" * 64}}, {"pid": 2, "library_sha256": {lib: "a" * 64}},
              {"pid": 3, "library_sha256": {}}]
    elf.library_deps(listed)
    want = {lib: {"needed": ["libcudart.so.13", "libc10.so"], "cuda_arches": ["sm_90"]}}
    assert [p["library_deps"] for p in listed] == [want, want, {}]
