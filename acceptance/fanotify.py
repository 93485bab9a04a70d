"""The census's kernel events: a fanotify reader beside the gate (stdlib only; docs/gates.md "Short processes").

`python -m acceptance.fanotify --pid P --out FILE` runs in a census container that shares the gate's pid
namespace (Docker: pid_mode container:<gate>, CAP_SYS_ADMIN for fanotify in the initial user namespace). It marks
every mount of the gate's mountinfo (reached through /proc/P/root) for FAN_OPEN_EXEC_PERM, and the files every
dynamically linked program opens right after its exec (the loader's cache, libc: FAN_OPEN_PERM inode marks).
Permission events make the process wait until the reader has read it, so even a 1 ms interpreter is seen:
  exec   at the exec, in the old program: pid, starttime, the file's identity and why it is an interpreter
         (acceptance/interpreters.py, read through the event's descriptor, never opened again);
  start  when the new program's loader opens its first library: exe, argv and the mark (acceptance/hook.py).
Every event is answered FAN_ALLOW (the census observes, it never blocks a program), also on error; a watchdog
answers one that waits past ANSWER_S, and the kernel allows what is pending once the descriptor closes.
One JSON line per event goes to FILE (O_APPEND, written before the answer): the gate reads them (exec_events.py)."""
import argparse
import ctypes
import json
import os
import select
import struct
import sys
import threading
import time
from typing import Any

from acceptance import procfs
from acceptance.hook import mark
from acceptance.interpreters import LOADER, Interpreters, mapped_programs

FAN_CLOEXEC, FAN_CLASS_CONTENT, FAN_UNLIMITED_QUEUE, FAN_UNLIMITED_MARKS = 0x1, 0x4, 0x10, 0x20
FAN_MARK_ADD, FAN_MARK_MOUNT = 0x1, 0x10
FAN_OPEN_PERM, FAN_OPEN_EXEC_PERM, FAN_Q_OVERFLOW = 0x10000, 0x40000, 0x4000
FAN_ALLOW = 0x1
AT_FDCWD = -100
EVENT = struct.Struct("=IBBHQii")  # fanotify_event_metadata: event_len, vers, reserved, metadata_len, mask, fd, pid
ANSWER_S = 2.0                     # the watchdog allows an event the reader has not answered by then
START_FILES = ("/etc/ld.so.cache",)  # opened by the loader of every dynamically linked program (libc: from maps)
ERRORS_KEPT = 20


class Unavailable(Exception):
    """fanotify cannot watch here (no CAP_SYS_ADMIN in the initial user namespace, a kernel without it)."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    return libc


def cpu_s() -> float:
    """CPU seconds of this container (its cgroup: v2 cpu.stat, v1 cpuacct.usage), else of this process."""
    stat = procfs.read("/sys/fs/cgroup/cpu.stat") or ""
    for line in stat.splitlines():
        if line.startswith("usage_usec "):
            return int(line.split()[1]) / 1e6
    usage = (procfs.read("/sys/fs/cgroup/cpuacct/cpuacct.usage") or "").strip()
    if usage.isdigit():
        return int(usage) / 1e9
    times = os.times()
    return times.user + times.system


def resolve(root: str, path: str) -> str:
    """`path` inside the tree at `root` (another container's /proc/P/root), its symlinks resolved there: an
    absolute link target starts again at `root`, not at this process's root."""
    parts, done, hops = [p for p in path.split("/") if p], "", 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            done = done.rsplit("/", 1)[0]
            continue
        if part == ".":
            continue
        try:
            target = os.readlink(root + done + "/" + part)
        except OSError:
            done += "/" + part
            continue
        hops += 1
        if hops > 40:
            break
        parts = [p for p in target.split("/") if p] + parts
        if target.startswith("/"):
            done = ""
    return root + (done or "/")


class Reader:
    """One gate's fanotify group: mark(), then serve() until the gate's pid is gone."""

    def __init__(self, pid: int, out: str, manifest: str) -> None:
        self.pid, self.root = pid, f"/proc/{pid}/root"
        self.start_time = procfs.starttime(pid)
        self.out = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.libc = _libc()
        data = _load(self.root + manifest)
        self.interpreters = Interpreters(data, f"/proc/{pid}/exe", self.root)
        self.execs: dict[tuple[int, int | None], list[tuple[int, int, str | None]]] = {}  # files exec'd, not started
        self.started: set[tuple[int, str | None]] = set()            # (pid, mark) already written
        self.marked_files: set[tuple[int, int]] = set()              # never opened here: a perm mark waits on us
        self.errors = 0
        self.fd = -1
        self.lock = threading.Lock()
        self.pending: dict[int, float] = {}

    def write(self, entry: dict[str, Any]) -> None:
        os.write(self.out, (json.dumps(entry) + "\n").encode())

    def mark(self) -> dict[str, Any]:
        """Mark every mount of the gate (FAN_OPEN_EXEC_PERM) and the start files (FAN_OPEN_PERM); the ready line."""
        self.fd = self.libc.fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC | FAN_UNLIMITED_QUEUE | FAN_UNLIMITED_MARKS,
                                          os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC)
        if self.fd < 0:
            raise Unavailable(f"fanotify_init: {os.strerror(ctypes.get_errno())}")
        marked, unmarked = [], []
        for mount in procfs.mounts(procfs.read(f"/proc/{self.pid}/mountinfo") or ""):
            where = mount["mount_point"]
            error = self._mark(FAN_MARK_ADD | FAN_MARK_MOUNT, FAN_OPEN_EXEC_PERM, self.root + where)
            (unmarked.append({"mount": where, "fstype": mount["fstype"], "error": error}) if error
             else marked.append(where))
        if "/" not in marked:
            raise Unavailable(f"cannot mark the gate's root mount: {unmarked[:1]}")
        maps = procfs.read(f"/proc/{self.pid}/maps") or ""
        libc = [p for p in procfs.mapped_libraries(maps) if os.path.basename(p).startswith("libc.so")]
        watched = []
        for path in [*START_FILES, *libc]:
            real = resolve(self.root, path)
            try:
                st = os.stat(real)
            except OSError:
                continue
            if not self._mark(FAN_MARK_ADD, FAN_OPEN_PERM, real):
                self.marked_files.add((st.st_dev, st.st_ino))
                watched.append(path)
        ready = {"kind": "ready", "pid": self.pid, "marked": marked, "unmarked": unmarked, "watched": watched,
                 "t": time.monotonic(), "cpu_s": round(cpu_s(), 4)}
        self.write(ready)
        return ready

    def _mark(self, flags: int, mask: int, path: str) -> str | None:
        if self.libc.fanotify_mark(self.fd, flags, mask, AT_FDCWD, path.encode()) == 0:
            return None
        return os.strerror(ctypes.get_errno())

    def serve(self) -> None:
        """Read and answer events until the gate is gone."""
        threading.Thread(target=self._watchdog, name="watchdog", daemon=True).start()
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while procfs.starttime(self.pid) == self.start_time:
            if not poller.poll(500):
                continue
            try:
                data = os.read(self.fd, 65536)
            except InterruptedError:
                continue
            for at in range(0, len(data) - EVENT.size + 1, EVENT.size):
                length, _, _, _, mask, fd, pid = EVENT.unpack_from(data, at)
                if length != EVENT.size:
                    self._error(f"event of {length} bytes (expected {EVENT.size})")
                self._one(mask, fd, pid)

    def _one(self, mask: int, fd: int, pid: int) -> None:
        if fd < 0:
            if mask & FAN_Q_OVERFLOW:
                self._error("event queue overflow")
            return
        with self.lock:
            self.pending[fd] = time.monotonic()
        try:
            if mask & FAN_OPEN_EXEC_PERM:
                self._exec(fd, pid)
            elif mask & FAN_OPEN_PERM:
                self._start(pid)
        except Exception as err:  # noqa: BLE001 - an event is always answered; the error is kept
            self._error(f"pid {pid}: {err.__class__.__name__}: {err}")
        finally:
            self._answer(fd)
            os.close(fd)

    def _answer(self, fd: int) -> None:
        with self.lock:
            if self.pending.pop(fd, None) is None:
                return  # the watchdog answered it
        try:
            os.write(self.fd, struct.pack("=iI", fd, FAN_ALLOW))
        except OSError as err:
            self._error(f"answer: {err}")

    def _watchdog(self) -> None:
        while True:
            time.sleep(ANSWER_S / 4)
            now = time.monotonic()
            with self.lock:
                late = [fd for fd, since in self.pending.items() if now - since > ANSWER_S]
                for fd in late:
                    del self.pending[fd]
                    try:
                        os.write(self.fd, struct.pack("=iI", fd, FAN_ALLOW))
                    except OSError:
                        pass
            for _ in late:
                self._error(f"an event waited over {ANSWER_S} s: allowed by the watchdog")

    def _exec(self, fd: int, pid: int) -> None:
        """A program is being exec'd: who (still in its old program), which file, whether it is an interpreter."""
        fields = procfs.stat_fields(procfs.read(f"/proc/{pid}/stat"))
        st = os.fstat(fd)
        why = None if (st.st_dev, st.st_ino) in self.marked_files else self.interpreters.program(fd)
        start = int(fields[19]) if fields else None
        self.execs.setdefault((pid, start), []).append((st.st_dev, st.st_ino, why))
        self.write({"kind": "exec", "pid": pid, "starttime": start, "ppid": int(fields[1]) if fields else None,
                    "exe": procfs.link(f"/proc/self/fd/{fd}"), "dev": st.st_dev, "ino": st.st_ino, "why": why,
                    "t": round(time.monotonic(), 6), "cpu_s": round(cpu_s(), 4)})

    def _start(self, pid: int) -> None:
        """The new program's loader opened a start file: its exe, argv and mark, once per program."""
        fields = procfs.stat_fields(procfs.read(f"/proc/{pid}/stat"))
        try:
            exe_stat: os.stat_result | None = os.stat(f"/proc/{pid}/exe")
        except OSError:
            exe_stat = None
        now = mark(fields, exe_stat)
        if (pid, now) in self.started:
            return
        self.started.add((pid, now))
        start = int(fields[19]) if fields else None
        exe = procfs.link(f"/proc/{pid}/exe")
        execs = self.execs.pop((pid, start), [])
        ident = (exe_stat.st_dev, exe_stat.st_ino) if exe_stat else None
        why = next((w for d, i, w in execs if (d, i) == ident), None)
        if why is None and exe and ident and LOADER.fullmatch(os.path.basename(exe)):
            maps = procfs.read(f"/proc/{pid}/maps") or ""
            programs = [self.root + p for p in mapped_programs(maps, exe)]
            if any(not self._marked(p) and self.interpreters.program(p) for p in programs):
                why = "loader"
        cmdline = procfs.read(f"/proc/{pid}/cmdline") or ""
        self.write({"kind": "start", "pid": pid, "starttime": start, "ppid": int(fields[1]) if fields else None,
                    "mark": now, "exe": exe, "argv": cmdline.rstrip("\0").split("\0") if cmdline else [], "why": why,
                    "t": round(time.monotonic(), 6)})

    def _marked(self, path: str) -> bool:
        """A file this reader must not open: a perm mark on it would wait on the reader itself."""
        try:
            st = os.stat(path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) in self.marked_files

    def _error(self, text: str) -> None:
        self.errors += 1
        if self.errors <= ERRORS_KEPT:
            self.write({"kind": "error", "error": text, "t": round(time.monotonic(), 6)})


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m acceptance.fanotify")
    parser.add_argument("--pid", type=int, default=1, help="the gate's pid (its mounts are marked)")
    parser.add_argument("--out", required=True, help="the JSON lines file the gate reads")
    parser.add_argument("--manifest", default="/opt/delivery/manifest.json", help="the image's manifest, in the gate")
    args = parser.parse_args(argv)
    reader = Reader(args.pid, args.out, args.manifest)
    try:
        reader.mark()
    except Unavailable as err:
        reader.write({"kind": "unavailable", "error": str(err), "t": time.monotonic()})
        print(f"fanotify: {err}", file=sys.stderr)
        return 0
    reader.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
