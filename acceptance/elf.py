"""What a loaded native library needs and what GPU code it carries, read from its ELF file (stdlib only: the suite
runs inside the image, where the files are).

needed(path)        its DT_NEEDED entries (the .dynamic section's, names from its linked string table), in order
cuda_arches(path)   the targets of its CUDA code: each fatbin entry of its .nv_fatbin section, sm_XX (sm_90a for
                    an architecture-specific one) for a cubin, compute_XX for PTX; [] for a library without CUDA
                    code. On an H200 host's CUDA 13 libraries (cuBLAS, cuDNN, NCCL) the sm_ list equals
                    `cuobjdump --list-elf`'s
Only headers are read (section headers, .dynamic, the fatbin entry headers), never a whole section, so a library of
hundreds of MB costs a few reads. 64-bit little-endian ELF only (x86-64, aarch64); anything else reads as nothing."""
import struct
from typing import Any, BinaryIO

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (b".nv_fatbin", b"__nv_relfatbin")
KINDS = {1: "compute", 2: "sm"}   # fatbin entry kinds: 1 PTX, 2 cubin (an ELF for one GPU architecture)
ARCH_SPECIFIC = 0x100000          # an entry flag: sm_90a, sm_100a (cuobjdump's names; checked on CUDA 13's libraries)
DT_NEEDED, DT_NULL = 1, 0
MOST_ENTRIES = 100_000            # a fatbin section's entries read at most (a bound on a hostile file)
Sections = dict[bytes, tuple[int, int, int]]  # name -> (offset, size, sh_link)
STRTAB = b"\0dynamic strings"            # not a section name: .dynamic's linked string table


def sections(fh: BinaryIO) -> Sections:
    """The section table by name: {name: (offset, size, link)}, and .dynamic's string table (its sh_link) under
    STRTAB; {} for what is no 64-bit little-endian ELF."""
    head = fh.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return {}
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if not shoff or shentsize < 64 or not 0 < shnum < 65536 or shstrndx >= shnum:
        return {}
    fh.seek(shoff)
    table = fh.read(shentsize * shnum)
    rows = [struct.unpack_from("<IIQQQQI", table, i * shentsize) for i in range(len(table) // shentsize)]
    if shstrndx >= len(rows):
        return {}
    fh.seek(rows[shstrndx][4])
    names = fh.read(min(rows[shstrndx][5], 1 << 20))
    out: Sections = {}
    for name_at, _, _, _, offset, size, link in rows:
        name = names[name_at:names.find(b"\0", name_at)] if name_at < len(names) else b""
        out.setdefault(name, (offset, size, link))
    if b".dynamic" in out and out[b".dynamic"][2] < len(rows):
        strtab = rows[out[b".dynamic"][2]]
        out[STRTAB] = (strtab[4], strtab[5], 0)
    return out


def needed(path: str) -> list[str]:
    """The library's DT_NEEDED names, in order; [] when it has none or is no ELF this reader knows."""
    try:
        with open(path, "rb") as fh:
            found = sections(fh)
            if b".dynamic" not in found or STRTAB not in found:
                return []
            offset, size, _ = found[b".dynamic"]
            strtab, strsize, _ = found[STRTAB]
            fh.seek(offset)
            dynamic = fh.read(min(size, 1 << 20))
            out = []
            for tag, value in struct.iter_unpack("<qQ", dynamic[:len(dynamic) // 16 * 16]):
                if tag == DT_NULL:
                    break
                if tag == DT_NEEDED and value < strsize:
                    fh.seek(strtab + value)
                    out.append(fh.read(min(4096, strsize - value)).split(b"\0", 1)[0].decode("utf-8", "replace"))
            return out
    except (OSError, struct.error, ValueError):
        return []


def cuda_arches(path: str) -> list[str]:
    """The GPU targets of the library's fatbin entries (sorted, each once); [] without a fatbin section."""
    try:
        with open(path, "rb") as fh:
            found = sections(fh)
            arches: set[str] = set()
            for name in FATBIN_SECTIONS:
                if name in found:
                    arches |= _fatbin(fh, *found[name][:2])
            return sorted(arches, key=_order)
    except (OSError, struct.error, ValueError):
        return []


def _fatbin(fh: BinaryIO, offset: int, size: int) -> set[str]:
    """Walk the fatbins one after another in a section: each a 16-byte header (magic, version, header size, size of
    its entries), then entries, each a header of at least 48 bytes (kind, header size, payload size, ..., the
    architecture at +28, flags at +40)."""
    arches: set[str] = set()
    at, end, seen = offset, offset + size, 0
    while at + 16 <= end and seen < MOST_ENTRIES:
        fh.seek(at)
        magic, _, header, body = struct.unpack("<IHHQ", fh.read(16))
        if magic != FATBIN_MAGIC:
            at += 8  # fatbins are 8-byte aligned in the section: look at the next slot
            continue
        entry, stop = at + header, min(at + header + body, end)
        while entry + 48 <= stop and seen < MOST_ENTRIES:
            fh.seek(entry)
            kind, _, entry_header, payload, _, _, _, _, arch, _, _, flags = struct.unpack("<HHIQIIHHIIIQ", fh.read(48))
            if kind in KINDS and arch:
                arches.add(f"{KINDS[kind]}_{arch}{'a' if flags & ARCH_SPECIFIC else ''}")
            seen += 1
            if entry_header < 48:
                break
            entry += entry_header + payload
        at = max(stop, at + 16)
    return arches


def _order(arch: str) -> tuple[int, str]:
    """By architecture number, then compute (PTX) before sm, sm_90 before sm_90a."""
    kind, _, number = arch.partition("_")
    digits = number.rstrip("abcdefghijklmnopqrstuvwxyz")
    return (int(digits) if digits.isdigit() else 0, kind + number)


def library_deps(listed: list[dict[str, Any]]) -> None:
    """Add to each judged process (acceptance.processes.judge) `library_deps`: for each library a distribution owns
    (those with a sha256 in `library_sha256`), its DT_NEEDED names and CUDA targets; each file read once."""
    seen: dict[str, dict[str, list[str]]] = {}
    for proc in listed:
        deps = {}
        for path in proc.get("library_sha256") or {}:
            if path not in seen and not path.endswith(" (deleted)"):
                seen[path] = {"needed": needed(path), "cuda_arches": cuda_arches(path)}
            if path in seen:
                deps[path] = seen[path]
        proc["library_deps"] = deps
