"""Is this program a Python interpreter? Judged by content, never by its name alone (stdlib only).

In order, the first rule that holds is the reason the census gives (docs/gates.md):
  identity   its file is one of the image's interpreters: the same device and inode as the manifest's
             `interpreters` (or the gate's own), or the same sha256 as one of them (a renamed copy);
  elf        an ELF file carrying the Python runtime (the `_PyRuntime` or `Py_Initialize` dynamic symbol);
  loader     it is the dynamic loader, and a program it mapped is an interpreter by the two rules above;
  libpython  it maps a libpython;
  name       its executable is named python* (kept: a name alone is enough to count, never needed).
Every verdict is cached by (device, inode, size, mtime), so a file is read once a census."""
import hashlib
import mmap
import os
import re
from typing import Any

from acceptance.procfs import sha256

RUNTIME = (b"\0_PyRuntime\0", b"\0Py_Initialize\0")
ELF = b"\x7fELF"
PYTHON_NAME = re.compile(r"python[0-9.]*[a-z]?")
LIBPYTHON = re.compile(r"/libpython[0-9.]+[a-z]?\.so")
LOADER = re.compile(r"ld-.*\.so.*|ld\.so")
Key = tuple[int, int, int, int]


def file_key(st: os.stat_result) -> Key:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def carries_runtime(path: str | int) -> bool:
    """True for an ELF file whose bytes name the Python runtime's entry points (its dynamic symbol table); `path`
    may be a file descriptor (read in place, never opened again: acceptance/fanotify.py)."""
    try:
        if isinstance(path, int):
            return os.pread(path, 4, 0) == ELF and _finds(path)
        with open(path, "rb") as fh:
            return fh.read(4) == ELF and _finds(fh.fileno())
    except (OSError, ValueError):
        return False


def _finds(fd: int) -> bool:
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as data:
        return any(data.find(word) >= 0 for word in RUNTIME)


def fd_sha256(fd: int) -> str | None:
    """sha256 of an open file's content, read with pread (the descriptor's offset stays)."""
    digest, at = hashlib.sha256(), 0
    try:
        while block := os.pread(fd, 1 << 20, at):
            digest.update(block)
            at += len(block)
    except OSError:
        return None
    return digest.hexdigest()


def listed(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's interpreters ([{path, sha256}]); older manifests list none."""
    found = manifest.get("interpreters")
    return [i for i in found if isinstance(i, dict)] if isinstance(found, list) else []


class Interpreters:
    """The image's interpreters (the manifest's list and the gate's own), and a cache of verdicts."""

    def __init__(self, manifest: dict[str, Any], own: str | None = None, root: str = "") -> None:
        """`root`: where the image's root is seen from here (/proc/<pid>/root from another container)."""
        entries = listed(manifest)
        self.digests = {str(i.get("sha256")) for i in entries if i.get("sha256")}
        self.ids: set[tuple[int, int]] = set()
        self.sizes: set[int] = set()  # only a file of an interpreter's size is hashed
        for path in [own] + [root + str(i.get("path")) for i in entries]:
            try:
                st = os.stat(path) if path else None
            except OSError:
                continue
            if st is not None:
                self.ids.add((st.st_dev, st.st_ino))
                self.sizes.add(st.st_size)
        self.cache: dict[Key, str | None] = {}

    def program(self, path: str | int) -> str | None:
        """"identity" or "elf" for an interpreter's file (path may be /proc/<pid>/exe, or an open descriptor),
        None for any other."""
        try:
            st = os.fstat(path) if isinstance(path, int) else os.stat(path)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) in self.ids:
            return "identity"
        key = file_key(st)
        if key not in self.cache:
            verdict = None
            if st.st_size in self.sizes and (fd_sha256(path) if isinstance(path, int) else sha256(path)) in self.digests:
                verdict = "identity"
            elif carries_runtime(path):
                verdict = "elf"
            self.cache[key] = verdict
        return self.cache[key]

    def why(self, pid: int | str, exe: str | None, maps: str | None) -> str | None:
        """Why process pid (running exe, mapping `maps`) counts as an interpreter; None when it does not."""
        if exe is None:
            return None
        clean = exe.removesuffix(" (deleted)")
        verdict = self.program(f"/proc/{pid}/exe")
        if verdict:
            return verdict
        if maps and LOADER.fullmatch(os.path.basename(clean)):
            for path in mapped_programs(maps, clean):
                if self.program(path):
                    return "loader"
        if maps and LIBPYTHON.search(maps):
            return "libpython"
        return "name" if PYTHON_NAME.fullmatch(os.path.basename(clean)) else None


def mapped_programs(maps: str, exe: str) -> list[str]:
    """Files in /proc/<pid>/maps that are no shared object and not the executable: what the loader mapped."""
    out: list[str] = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].endswith(" (deleted)"):
            continue
        path, name = parts[5], parts[5].rsplit("/", 1)[-1]
        if path != exe and not (name.endswith(".so") or ".so." in name) and path not in out:
            out.append(path)
    return out
