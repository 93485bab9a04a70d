"""Checks of native builds inside the image (stdlib only, Python >= 3.8).

- CUDA arch coverage: every extension with device code carries code for every arch of the pins'
  list (TORCH_CUDA_ARCH_LIST form: 9.0, 10.0a, 8.0+PTX). `cuobjdump --list-elf/--list-ptx` when the
  base has it, else the fatbin headers read from the .so (fatbin_archs).
- The base's torch untouched: every file its RECORD lists (the RECORD itself as read from the base
  at lock time) still has its hash.
"""
import os
import re
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import record_hash, sha256_file  # noqa: E402

FATBIN_MAGIC = 0xBA55ED50
HEADER = struct.Struct("<IHHQ")              # magic, version, header size, size of the entries
ENTRY = struct.Struct("<HHIQIIHHI")          # kind, ?, header size, payload size, compressed size, ?, minor, major, arch
KIND_PTX, KIND_ELF = 1, 2


def fatbin_archs(data):
    """{"elf": {sm, ...}, "ptx": {sm, ...}} of every fatbin in data (e.g. an extension's bytes)."""
    found = {"elf": set(), "ptx": set()}
    magic = struct.pack("<I", FATBIN_MAGIC)
    at = data.find(magic)
    while at != -1:
        if at + HEADER.size <= len(data):
            _, version, header_size, size = HEADER.unpack_from(data, at)
            end = at + header_size + size
            if version == 1 and header_size >= HEADER.size and end <= len(data):
                entry = at + header_size
                while entry + ENTRY.size <= end:
                    kind, _, entry_header, payload, _, _, _, _, arch = ENTRY.unpack_from(data, entry)
                    if kind not in (KIND_PTX, KIND_ELF) or entry_header < ENTRY.size or entry + entry_header + payload > end:
                        break
                    found["ptx" if kind == KIND_PTX else "elf"].add(arch)
                    entry += entry_header + payload
        at = data.find(magic, at + 1)
    return found


def cuobjdump_archs(path, tool):
    found = {"elf": set(), "ptx": set()}
    for kind, flag in (("elf", "--list-elf"), ("ptx", "--list-ptx")):
        proc = subprocess.run([tool, flag, path], capture_output=True, text=True, check=False)
        found[kind] |= {int(m) for m in re.findall(r"sm_([0-9]+)[a-z]?", proc.stdout)}
    return found


def archs_of(path):
    tool = shutil.which("cuobjdump")
    if tool:
        return cuobjdump_archs(path, tool), "cuobjdump"
    with open(path, "rb") as fh:
        return fatbin_archs(fh.read()), "fatbin headers"


def arch_number(arch):
    """'9.0' -> (90, False); '10.0a' -> (100, False); '8.0+PTX' -> (80, True)."""
    ptx = arch.endswith("+PTX")
    major, minor = arch[:-4 if ptx else None].rstrip("af").split(".")
    return int(major) * 10 + int(minor), ptx


def check_archs(libs, arch_list, reader=archs_of):
    """(problems, {lib: found}) for the extensions libs against the arch list: every lib with device code
    has an ELF (or, for +PTX, an ELF or PTX) for every arch; at least one lib has device code."""
    problems, seen = [], {}
    for lib in sorted(libs):
        found, how = reader(lib)
        if not found["elf"] and not found["ptx"]:
            continue  # host code only
        seen[lib] = {"elf": sorted(found["elf"]), "ptx": sorted(found["ptx"]), "read_with": how}
        for arch in arch_list:
            number, ptx = arch_number(arch)
            if number not in found["elf"] and not (ptx and number in found["ptx"]):
                have = ", ".join(f"sm_{n}" for n in sorted(found["elf"])) or "none"
                problems.append(f"{lib}: no code for CUDA arch {arch} (sm_{number}); it carries {have} ({how})")
    if libs and not seen:
        problems.append(f"no extension carries CUDA device code ({len(libs)} checked)")
    return problems, seen


def check_record(info_dir, expected_sha256):
    """Problems with a distribution's files: RECORD changed since the base, or a file it lists differs."""
    import csv

    record = os.path.join(info_dir, "RECORD")
    if not os.path.isfile(record):
        return [f"{record}: missing"]
    if sha256_file(record) != expected_sha256:
        return [f"{record}: changed since the base (sha256 {sha256_file(record)}, the base's {expected_sha256})"]
    problems = []
    root = os.path.dirname(info_dir)
    with open(record, newline="") as fh:
        for row in csv.reader(fh):
            if len(row) < 2 or not row[1]:
                continue
            path = os.path.normpath(os.path.join(root, row[0]))
            if not os.path.isfile(path):
                problems.append(f"{path}: missing")
            elif record_hash(sha256_file(path)) != row[1]:
                problems.append(f"{path}: differs from the base's RECORD")
    return problems
