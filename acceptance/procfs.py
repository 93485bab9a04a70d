"""What the running process actually sees: mounts (/proc/self/mountinfo) and mapped files (/proc/self/maps)."""
import hashlib
import os
import re
from collections.abc import Iterable

ESCAPE = re.compile(r"\\([0-7]{3})")
SHARED = re.compile(r"\.so(\.[0-9]+)*$")


def _unescape(field: str) -> str:
    return ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


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


def mapped_libraries(text: str | None = None) -> list[str]:
    """Paths of shared objects mapped into this process (a ' (deleted)' suffix is kept: the file is gone)."""
    if text is None:
        with open("/proc/self/maps") as fh:
            text = fh.read()
    seen = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5]
        name = path.removesuffix(" (deleted)").rsplit("/", 1)[-1]
        if SHARED.search(name) and path not in seen:
            seen.append(path)
    return seen


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
