"""The one reader of /proc (and file digests) for the suite: what a process sees (mounts, mapped shared
objects, its stat fields) and the sha256 of a file. Stdlib only: the start-up hook (acceptance/hook.py) imports it
in every Python process of the image, and loads it as a plain sibling file when it runs by path before the suite
is importable (`python hook.py install PREFIX`)."""
import hashlib
import os
from collections.abc import Iterable


def read(path: str) -> str | None:
    """A /proc (or other) text file, undecodable bytes replaced; None when it cannot be read (a process gone)."""
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def stat_fields(text: str | None) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on: [state, ppid, ..., starttime at index 19, ...]; the command
    name in parentheses may hold spaces and parentheses, so split after the last ')'."""
    if not text or ")" not in text:
        return None
    fields = text.rpartition(")")[2].split()
    return fields if len(fields) > 19 else None


def starttime(pid: int | str = "self") -> int | None:
    """Clock ticks after boot when the process started: with its pid, who it is (a pid is reused)."""
    fields = stat_fields(read(f"/proc/{pid}/stat"))
    return int(fields[19]) if fields else None


def is_shared(path: str) -> bool:
    """A shared object's file name: `x.so` or `x.so.<anything>`."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name


def _unescape(field: str) -> str:
    import re  # only mountinfo needs it: the hook's import in every process stays small

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts(text: str | None = None) -> list[dict[str, str]]:
    """[{mount_point, root, fstype, source, options}] from mountinfo (fields per proc(5))."""
    if text is None:
        with open("/proc/self/mountinfo") as fh:
            text = fh.read()
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 6:
            continue
        tail = right.split()
        out.append({"mount_point": _unescape(fields[4]), "root": _unescape(fields[3]),
                    "options": fields[5], "fstype": tail[0] if tail else "",
                    "source": _unescape(tail[1]) if len(tail) > 1 else ""})
    return out


def covers(mount_point: str, path: str) -> bool:
    """True when the mount at mount_point decides what `path` is (mount point equals it or is above it)."""
    mount_point = mount_point.rstrip("/") or "/"
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def read_only_root(table: list[dict[str, str]]) -> bool:
    """True when the mount in force on / (the last one listed there) is read-only: its files cannot change."""
    root = [m for m in table if m["mount_point"] == "/"][-1:]
    return bool(root) and "ro" in root[0]["options"].split(",")


def build_hashes(manifest: dict[str, object], table: list[dict[str, str]] | None = None) -> dict[str, str]:
    """{path: sha256} of what the build already hashed (the manifest's component files and native libraries, and
    native_owners: every native library a distribution's RECORD names), to be trusted by path, not hashed again:
    only when the image root is mounted read-only, and only for paths no other mount covers. Files on a writable
    root or on any other mount (/tmp, scratch, binds) are hashed where they are read ({} here)."""
    table = mounts() if table is None else table
    if not read_only_root(table):
        return {}
    found: dict[str, str] = {}
    comps = manifest.get("components")
    for comp in comps.values() if isinstance(comps, dict) else []:
        for key in ("files", "native_libs"):
            entries = comp.get(key) if isinstance(comp, dict) else None
            found.update({str(p): str(d) for p, d in (entries if isinstance(entries, dict) else {}).items() if d})
    owners = manifest.get("native_owners")
    for path, entry in (owners.items() if isinstance(owners, dict) else []):
        if isinstance(entry, dict) and entry.get("sha256"):
            found.setdefault(str(path), str(entry["sha256"]))
    others = [m["mount_point"] for m in table if m["mount_point"] != "/"]
    return {p: d for p, d in found.items() if not any(covers(m, p) for m in others)}


def mapped_libraries(text: str | None = None) -> list[str]:
    """Paths of shared objects in /proc/<pid>/maps text (default: this process's), in order, each once (a
    ' (deleted)' suffix is kept: the file is gone)."""
    if text is None:
        text = read("/proc/self/maps") or ""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and is_shared(parts[5].removesuffix(" (deleted)")):
            seen[parts[5]] = None
    return list(seen)


def sha256(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def startup_hooks(path_entries: Iterable[str]) -> dict[str, str | None]:
    """Code the interpreter runs at start-up: *.pth files in site dirs and sitecustomize/usercustomize
    modules anywhere on sys.path. {absolute path: sha256}; the caller passes sys.path."""
    found: dict[str, str | None] = {}
    for entry in path_entries:
        if not entry or not os.path.isdir(entry):
            continue
        for name in sorted(os.listdir(entry)):
            if name.endswith(".pth") or name in ("sitecustomize.py", "usercustomize.py",
                                                  "sitecustomize", "usercustomize"):
                path = os.path.realpath(os.path.join(entry, name))
                found[path] = sha256(path) if os.path.isfile(path) else "directory"
    return dict(sorted(found.items()))
