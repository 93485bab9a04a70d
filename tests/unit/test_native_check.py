"""In-image native checks: CUDA arch coverage from fatbin headers (or cuobjdump), native modules loaded
from the component, the base's torch unchanged (builder/image/scripts/native_check.py, smoke.py)."""
from __future__ import annotations  # native_check.Archs is for the checker only

import csv
import hashlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "builder" / "image" / "scripts"))
import native_check  # noqa: E402
import smoke  # noqa: E402
from common import record_hash  # noqa: E402


def fatbin(entries: list[tuple[int, int]]) -> bytes:
    """A fatbin blob as nvcc embeds it: header, then per entry a 64-byte header and its payload."""
    body = b""
    for kind, arch in entries:
        payload = b"\x7fELF" + bytes(60) if kind == native_check.KIND_ELF else b".version 8.0\n" + bytes(3)
        header = native_check.ENTRY.pack(kind, 0x0101, 64, len(payload), 0, 0, 0, 8, arch).ljust(64, b"\0")
        body += header + payload
    return native_check.HEADER.pack(native_check.FATBIN_MAGIC, 1, 16, len(body)) + body


def extension(tmp_path: Path, entries: list[tuple[int, int]], name: str = "_C.so") -> str:
    """A fake extension: some host bytes, the .nv_fatbin blob, more bytes."""
    path = tmp_path / name
    path.write_bytes(b"\x7fELF" + bytes(100) + fatbin(entries) + b"\xba\x55" + bytes(50))
    return str(path)


def by_headers(path: str) -> tuple[native_check.Archs, str]:
    return native_check.fatbin_archs(Path(path).read_bytes()), "fatbin headers"


def test_fatbin_headers_give_the_archs_of_a_synthetic_blob() -> None:
    found = native_check.fatbin_archs(b"junk" + fatbin([(2, 90), (2, 100), (1, 100)]) + b"tail")
    assert found == {"elf": {90, 100}, "ptx": {100}}
    assert native_check.fatbin_archs(b"\x50\xed\x55\xba" + bytes(10)) == {"elf": set(), "ptx": set()}  # truncated


def test_every_listed_arch_present_passes(tmp_path: Path) -> None:
    lib = extension(tmp_path, [(2, 90), (2, 100)])
    problems, seen = native_check.check_archs([lib], ["9.0", "10.0a"], by_headers)
    assert problems == [] and seen[lib]["elf"] == [90, 100]


def test_a_planted_wrong_arch_list_fails(tmp_path: Path) -> None:
    lib = extension(tmp_path, [(2, 80)])  # built for Ampere, the pins say Hopper
    problems, _ = native_check.check_archs([lib], ["9.0"], by_headers)
    assert problems == [f"{lib}: no code for CUDA arch 9.0 (sm_90); it carries sm_80 (fatbin headers)"]


def test_ptx_counts_only_for_plus_ptx(tmp_path: Path) -> None:
    lib = extension(tmp_path, [(2, 90), (1, 120)])
    assert native_check.check_archs([lib], ["9.0", "12.0+PTX"], by_headers)[0] == []
    assert native_check.check_archs([lib], ["12.0"], by_headers)[0]


def test_no_device_code_at_all_fails_a_cuda_target(tmp_path: Path) -> None:
    host = tmp_path / "host.so"
    host.write_bytes(b"\x7fELF" + bytes(200))
    assert native_check.check_archs([str(host)], ["9.0"], by_headers)[0] == ["no extension carries CUDA device code (1 checked)"]


def test_cuobjdump_output_is_parsed(tmp_path: Path) -> None:
    tool = tmp_path / "cuobjdump"
    tool.write_text("#!/bin/sh\n[ \"$1\" = --list-elf ] && echo 'ELF file    1: x.1.sm_90a.cubin' && "
                    "echo 'ELF file    2: x.2.sm_100.cubin'\nexit 0\n")
    tool.chmod(0o755)
    assert native_check.cuobjdump_archs("lib.so", str(tool)) == {"elf": {90, 100}, "ptx": set()}


class Dist:
    def __init__(self, files: list[str]) -> None:
        self.files = files

    def locate_file(self, f: str) -> str:
        return f


def test_smoke_fails_a_cuda_component_built_for_the_wrong_archs(tmp_path: Path) -> None:
    lib = extension(tmp_path, [(2, 80)])
    with pytest.raises(SystemExit, match=r"builder: vllm: .*no code for CUDA arch 9.0 \(sm_90\)"):
        smoke.check_native("vllm", {"device": "cuda", "cuda_arch": ["9.0"]}, Dist([lib]), [str(tmp_path)], by_headers)
    ok = smoke.check_native("vllm", {"device": "cuda", "cuda_arch": ["8.0"]}, Dist([lib]), [str(tmp_path)], by_headers)
    assert ok["cuda_arch"][lib]["elf"] == [80]


def test_smoke_native_module_must_be_a_shared_object_in_the_sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "purepy.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit, match=r"native module purepy loaded from .*purepy.py, expected a shared object"):
        smoke.check_native("vllm", {"modules": ["purepy"]}, Dist([]), [str(tmp_path)])


def fake_torch(site: Path) -> dict[str, dict[str, str]]:
    info = site / "torch-2.13.0.dist-info"
    (site / "torch").mkdir(parents=True)
    info.mkdir()
    rows = []
    for rel, data in (("torch/__init__.py", b"x = 1\n"), ("torch/version.py", b"__version__ = '2.13.0'\n")):
        (site / rel).write_bytes(data)
        rows.append([rel, record_hash(hashlib.sha256(data).hexdigest()), str(len(data))])
    rows.append(["torch-2.13.0.dist-info/RECORD", "", ""])
    with open(info / "RECORD", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return {"torch": {"version": "2.13.0", "record": "torch-2.13.0.dist-info/RECORD",
                      "sha256": hashlib.sha256((info / "RECORD").read_bytes()).hexdigest()}}


def test_the_bases_torch_unchanged_passes(tmp_path: Path) -> None:
    records = fake_torch(tmp_path)
    assert smoke.check_base_records(records, [str(tmp_path)]) == {"torch": "2.13.0"}


def test_a_changed_torch_file_fails_the_build(tmp_path: Path) -> None:
    records = fake_torch(tmp_path)
    (tmp_path / "torch" / "version.py").write_text("__version__ = '2.14.0'\n")  # a component overwrote it
    with pytest.raises(SystemExit, match=r"builder: the base's torch 2.13.0 changed: .*torch/version.py: differs"):
        smoke.check_base_records(records, [str(tmp_path)])


def test_a_replaced_torch_record_fails_the_build(tmp_path: Path) -> None:
    records = fake_torch(tmp_path)
    (tmp_path / "torch" / "version.py").write_text("new\n")
    info = tmp_path / "torch-2.13.0.dist-info" / "RECORD"  # a same-version reinstall rewrote RECORD to match
    info.write_text(info.read_text().replace(info.read_text().splitlines()[1].split(",")[1],
                                             record_hash(hashlib.sha256(b"new\n").hexdigest())))
    with pytest.raises(SystemExit, match=r"RECORD: changed since the base"):
        smoke.check_base_records(records, [str(tmp_path)])
