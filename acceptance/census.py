"""The gate's own census of the recipe's processes, taken without their cooperation (stdlib only).

The gate process becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER): a process whose parent exits is
re-parented to the gate, so it stays a descendant. A thread polls /proc every INTERVAL_S; each descendant of the
gate (ppid chain) is one row, keyed by (pid, starttime: /proc/<pid>/stat field 22). A row keeps the executable
and argv (each exec change too) and, at first sight and every DEEP_EVERY polls, the component files it maps
(/proc/<pid>/maps) or has open (/proc/<pid>/fd). The hook's records (acceptance.hook) are read as they appear;
one that is deleted, or rewritten shorter or with another beginning, before the end counts as no record.
A process that lives less than one poll is not seen by the poll (docs/gates.md says so); where the runner starts a
census container (Docker), its fanotify reader sees every exec however short (acceptance/exec_events.py)."""
import ctypes
import hashlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from acceptance import procfs
from acceptance.exec_events import ExecEvents
from acceptance.hook import image_identity, mark, node_name, shared_digest
from acceptance.interpreters import Interpreters, file_key

PR_SET_CHILD_SUBREAPER = 36
INTERVAL_S = 0.015
# with the census container's exec events on (Docker), every exec of an interpreter is seen there, however short;
# the poll is left the maps, fds and records of what runs, and looks less often (its CPU is most of the census's)
INTERVAL_WITH_EVENTS_S = 0.05
DEEP_EVERY = 10            # maps, fds and cmdline again every 10th poll (~150 ms)
FILES_KEPT = 8             # component files kept per row (the count is kept in full)
NO_ASLR = 0x0040000        # personality(2) ADDR_NO_RANDOMIZE: exec addresses repeat, so marks do too


def subreaper(on: bool = True) -> bool:
    """Make this process a child subreaper (or no longer one); False where prctl is not there (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def ticks_now() -> int:
    """Now, in the clock ticks after boot that /proc/<pid>/stat's starttime counts."""
    uptime = (procfs.read("/proc/uptime") or "0").split()[0]
    return int(float(uptime) * os.sysconf("SC_CLK_TCK"))




def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _denied(path: str) -> bool:
    """True when path exists but this process may not read it (EACCES/EPERM): another user, or not dumpable."""
    try:
        os.readlink(path) if path.endswith("/exe") else os.listdir(path) if path.endswith("/fd") else open(path).close()
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def _uid(pid: int) -> int | None:
    for line in (procfs.read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


class Components:
    """Which paths are a component's: the manifest's files and native libraries, everything under a component
    module's folder in site-packages, and, wherever it lies, any file whose content (sha256) is a component
    file's (only when its size is one of theirs; empty files never count). A digest taken already is never taken
    again: the build's by path on a read-only image root (procfs.build_hashes), the hook's in this container by
    path, device, inode, size and mtime (`shared`: the records' .hashes); only what neither has is hashed here."""

    def __init__(self, manifest: dict[str, Any], shared: str | None = None) -> None:
        self.manifest, self.shared = manifest, shared
        self.built: dict[str, str] | None = None
        self.hashed, self.reused = 0, 0
        site = (manifest.get("site_packages") or "").rstrip("/")
        comps = manifest.get("components") or {}
        self.site = site + "/" if site else "\0"
        hashes = {p: d for c in comps.values() for k in ("files", "native_libs") for p, d in (c.get(k) or {}).items()}
        self.files = set(hashes)
        self.digests = set(hashes.values())
        self.sizes = {st.st_size for p in hashes if (st := _stat(p)) is not None and st.st_size > 0}
        self.verdicts: dict[tuple[int, int, int, int], bool] = {}
        self.roots = tuple(sorted({f"{site}/{m.split('.')[0]}" for c in comps.values() for m in c.get("modules") or []}))

    def mapped(self, maps: str) -> set[str]:
        """The component files in /proc/<pid>/maps text: by path, or a shared object elsewhere by content."""
        found = set()
        for line in maps.splitlines():
            at = line.find("/")
            if at < 0:
                continue
            path = line[at:]
            if (path.startswith(self.site) or path in self.files) and self.owns(path):
                found.add(path)
            elif procfs.is_shared(path):
                if self.same_content(path):
                    found.add(path)
        return found

    def owns(self, path: str) -> bool:
        path = path.removesuffix(" (deleted)")
        if path in self.files:
            return True
        if path.startswith(self.site) and any(path == r or path.startswith(r + "/") or path.startswith(r + ".")
                                              for r in self.roots):
            return True
        return self.same_content(path)

    def same_content(self, path: str) -> bool:
        """A copy of a component file, wherever it lies (cached by device, inode, size and mtime)."""
        st = _stat(path)
        if st is None or st.st_size not in self.sizes:
            return False
        key = file_key(st)
        if key not in self.verdicts:
            self.verdicts[key] = self.digest(path, st) in self.digests
        return self.verdicts[key]

    def digest(self, path: str, st: os.stat_result) -> str | None:
        """The file's sha256: the build's, the hook's, else read here (the counts say which)."""
        if self.built is None:
            self.built = procfs.build_hashes(self.manifest)
        found = self.built.get(path)
        if found is None and self.shared:
            found = (procfs.read(shared_digest(self.shared, path, st)) or "").strip() or None
        if found is not None:
            self.reused += 1
            return found
        self.hashed += 1
        return procfs.sha256(path)


class Row:
    """One process of the run, as the census saw it: each image it ran (exe, argv, the component files it mapped
    or had open while running it), in order."""

    def __init__(self, pid: int, starttime: int, ppid: int, at: float) -> None:
        self.pid, self.starttime, self.ppid, self.first_ppid = pid, starttime, ppid, ppid
        self.images: list[dict[str, Any]] = []
        self.first, self.last = at, at
        self.state = ""
        self.addrs = ""
        self.gone = False

    @property
    def exe(self) -> str | None:
        return self.images[-1]["exe"] if self.images else None

    @property
    def argv(self) -> list[str]:
        return self.images[-1]["argv"] if self.images else []

    @property
    def mark(self) -> str | None:
        return self.images[-1]["mark"] if self.images else None

    def image(self, exe: str | None, argv: list[str], mark: str | None = None) -> bool:
        """True when this is a new image (first sight or an exec: the mark moved, or without marks exe or argv
        did); an unreadable one (a zombie) is no image. A new title under the same mark only renames it."""
        if exe is None and not argv:
            return False
        if self.images and (mark == self.mark if mark else (exe, argv) == (self.exe, self.argv)):
            self.images[-1]["argv"] = argv or self.argv
            return False
        self.images.append({"exe": exe, "argv": argv, "mark": mark, "files": set(), "why": None})
        return True

    def key(self) -> tuple[int, int]:
        return self.pid, self.starttime


class Census:
    """start() before the recipe, own(pid) for each process the gate starts itself, stop() after it."""

    def __init__(self, records_dir: str, components: Components, manifest_path: str,
                 interval_s: float = INTERVAL_S, enabled: bool = True, events: str | None = None) -> None:
        self.records_dir, self.components, self.interval_s = records_dir, components, interval_s
        self.enabled = enabled  # off: settings.census false (benchmarks measure the gate without it)
        self.manifest_path = manifest_path
        self.events = ExecEvents(events)  # the census container's fanotify reader, where the runner started one
        self.me = os.getpid()
        if components.shared is None:  # the hook's digests of this run (acceptance.hook.shared_digest)
            components.shared = records_dir
        self.interpreters = Interpreters(load_manifest(manifest_path), os.path.realpath(sys.executable))
        self.aslr = (procfs.read("/proc/sys/kernel/randomize_va_space") or "").strip()
        self.denied: dict[tuple[int, int], dict[str, Any]] = {}
        cmdline = procfs.read("/proc/self/cmdline") or ""
        self.own_image = {"exe": procfs.link("/proc/self/exe"), "argv": cmdline.rstrip("\0").split("\0"),
                          "mark": mark(procfs.stat_fields(procfs.read("/proc/self/stat")), _stat_exe("self"))}
        self.rows: dict[tuple[int, int], Row] = {}
        self.live: dict[int, Row] = {}
        self.last_pid: list[str] = []
        self.skip = {str(self.me)}  # /proc entries that are no process of the run (outsiders, the gate, self, ...)
        self.owned: set[int] = set()
        self.records: dict[str, dict[str, Any]] = {}
        self.polls = 0
        self.cpu_s = 0.0
        self.errors: list[str] = []
        self.reaper = False
        self.started = time.monotonic()
        self.since = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="census", daemon=True)

    def start(self) -> "Census":
        if not self.enabled:
            return self
        self.reaper = subreaper()
        self.started = time.monotonic()
        self.since = ticks_now() - 1  # a descendant older than the census is no process of this run
        self._thread.start()
        self.events.wait()
        if self.events.state == "on":
            self.interval_s = max(self.interval_s, INTERVAL_WITH_EVENTS_S)
        return self

    def own(self, pid: int) -> None:
        """A process the gate started and waits for itself (never reaped here)."""
        with self._lock:
            self.owned.add(pid)

    def stop(self) -> dict[str, Any] | None:
        """One last poll after the recipe ended, then the census as plain data (None when off)."""
        if not self.enabled:
            return None
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            self._poll(deep=True)
            self._read_records(final=True)
        self.events.sync()
        if self.reaper:
            subreaper(False)
        return self.result()

    # ---- the poll thread

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        while not self._stop.is_set():
            with self._lock:
                try:
                    self._poll(deep=self.polls % DEEP_EVERY == 0)
                    self._read_records(final=False)
                except Exception as err:  # noqa: BLE001 - kept; the census goes on
                    if len(self.errors) < 5:
                        self.errors.append(f"{err.__class__.__name__}: {err}")
            self._stop.wait(self.interval_s)
        self.cpu_s += time.thread_time() - cpu0

    def _poll(self, deep: bool) -> None:
        """One look at /proc. The whole listing only when a process was created since the last look (the last pid
        in /proc/loadavg moved) or on a deep poll; otherwise the live rows alone."""
        self.polls += 1
        now = round(time.monotonic() - self.started, 3)
        last = (procfs.read("/proc/loadavg") or "").rsplit(None, 1)[-1:]
        full = deep or last != self.last_pid
        self.last_pid = last
        stats = self._scan() if full else {pid: st for pid in self.live if (st := self._stat(str(pid)))}
        ours: dict[int, bool | None] = {self.me: True}
        ours.update({pid: True for pid in self.live if pid in stats and stats[pid][1] == self.live[pid].starttime})

        def owner(pid: int) -> bool | None:
            chain = []
            while pid not in ours:
                if pid <= 1 or str(pid) in self.skip:  # init, or a process already known not to be ours
                    ours[pid] = False
                    break
                if pid not in stats:
                    ours[pid] = None  # gone meanwhile: ask again next poll
                    break
                chain.append(pid)
                pid = stats[pid][0]
            for link in chain:
                ours[link] = ours[pid]
            return ours[pid]

        for pid in stats:
            if owner(pid) is False or (ours[pid] and pid not in self.live and stats[pid][1] < self.since):
                ours[pid] = False
                self.skip.add(str(pid))
        for pid, old in list(self.live.items()):
            if pid not in stats or stats[pid][1] != old.starttime:
                old.gone = True
                del self.live[pid]
        for pid, (ppid, start, state, vsize, addrs) in stats.items():
            if ours.get(pid) is not True:
                continue
            fresh = pid not in self.live
            row = self.live.get(pid) or self.rows.setdefault((pid, start), Row(pid, start, ppid, now))
            self.live[pid] = row
            row.ppid, row.last, row.state = ppid, now, state
            if state == "Z":
                self._reap(row)
                continue
            exe = procfs.link(f"/proc/{pid}/exe")
            new = False
            if fresh or deep or exe != row.exe or addrs != row.addrs:
                new = self._look(row, exe, addrs)
            if (fresh or deep or new) and row.images:
                self._files(row, row.images[-1], vsize)

    def _look(self, row: Row, exe: str | None, addrs: str) -> bool:
        """Read what the process runs now: its mark (exe identity + stat fields 48-51, read again after the exe so
        that an exec in between is never half seen), argv, why it is an interpreter, its personality."""
        fields = procfs.stat_fields(procfs.read(f"/proc/{row.pid}/stat"))
        now = mark(fields, _stat_exe(row.pid))
        if now is not None and (fields is None or ":".join(fields[45:49]) != addrs or "0" in addrs.split(":")):
            return False  # it exec'd while we looked (or is inside execve, no arguments yet): look again next poll
        row.addrs = addrs
        if exe is None and _denied(f"/proc/{row.pid}/exe"):
            self._deny(row, "exe")
        cmdline = procfs.read(f"/proc/{row.pid}/cmdline")
        if not row.image(exe, cmdline.rstrip("\0").split("\0") if cmdline else [], now):
            return False
        image = row.images[-1]
        image["why"] = self.interpreters.why(row.pid, exe, None)
        personality = (procfs.read(f"/proc/{row.pid}/personality") or "0").strip() or "0"
        image["no_aslr"] = bool(int(personality, 16) & NO_ASLR)
        return True

    def _deny(self, row: Row, what: str) -> None:
        """A descendant whose exe, maps or fds this census may not read: unaccounted (fails the gate)."""
        entry = self.denied.setdefault(row.key(), {"uid": _uid(row.pid), "unreadable": []})
        if what not in entry["unreadable"]:
            entry["unreadable"].append(what)

    def _stat(self, name: str) -> tuple[int, int, str, str, str] | None:
        """(ppid, starttime, state, vsize, stat fields 48-51): vsize moves when the process maps something new,
        fields 48-51 on every exec."""
        fields = procfs.stat_fields(procfs.read(f"/proc/{name}/stat")) if name.isdigit() else None
        return (int(fields[1]), int(fields[19]), fields[0], fields[20], ":".join(fields[45:49])) if fields else None

    def _scan(self) -> dict[int, tuple[int, int, str, str, str]]:
        """Every process in /proc not yet known to be an outsider."""
        names = set(os.listdir("/proc"))
        self.skip &= names  # an outsider that ended: its pid may come back as anyone
        stats = {}
        for name in names - self.skip:
            st = self._stat(name)
            if st is None:
                self.skip.add(name)  # not a process (self, sys, ...), or one that ended meanwhile
            else:
                stats[int(name)] = st
        return stats

    def _files(self, row: Row, image: dict[str, Any], vsize: str) -> None:
        """The component files the process maps (maps read again only when its size moved) or has open now, into
        its current image; with the maps, why it is an interpreter (the loader's program, a libpython)."""
        pid, files = row.pid, image["files"]
        if image.get("vsize") != vsize:
            image["vsize"] = vsize
            maps = procfs.read(f"/proc/{pid}/maps")
            if maps is None and _denied(f"/proc/{pid}/maps"):
                self._deny(row, "maps")
            if not image["why"] and maps:
                image["why"] = self.interpreters.why(pid, image["exe"], maps)
            files.update(self.components.mapped(maps or ""))
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except PermissionError:
            self._deny(row, "fds")
            return
        except OSError:
            return
        for fd in fds:
            target = procfs.link(f"/proc/{pid}/fd/{fd}")
            if target and target.startswith("/") and self.components.owns(target):
                files.add(target)

    def _reap(self, row: Row) -> None:
        """An orphan re-parented to the gate ends as its zombie: reap it (not the gate's own children)."""
        if row.ppid == self.me and row.first_ppid != self.me and row.pid not in self.owned:
            try:
                os.waitpid(row.pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def _read_records(self, final: bool) -> None:
        """Each record file as it grows (opened only when its size moved): its size, the sha256 of what was read,
        its first line. At the end each is read whole: what was read before must still be its beginning."""
        try:
            sizes = {e.name: e.stat().st_size for e in os.scandir(self.records_dir) if e.name.endswith(".jsonl")}
        except OSError:
            sizes = {}
        for name, rec in self.records.items():
            if name not in sizes and not rec["lost"]:
                rec["lost"] = "deleted"
        for name, size in sorted(sizes.items()):
            rec = self.records.setdefault(name, {"record": name, "size": 0, "head": b"", "sha": hashlib.sha256(),
                                                 "lost": None})
            if rec["lost"] or (size == rec["size"] and not final):
                continue
            if size < rec["size"]:
                rec["lost"] = f"rewritten shorter ({size} bytes after {rec['size']})"
                continue
            try:
                with open(os.path.join(self.records_dir, name), "rb") as fh:
                    data = fh.read() if final else b""
                    if final and hashlib.sha256(data[:rec["size"]]).digest() != rec["sha"].digest():
                        rec["lost"] = "rewritten (its beginning changed during the run)"
                        continue
                    if not final:
                        fh.seek(rec["size"])
                    new = data[rec["size"]:] if final else fh.read(size - rec["size"])
            except FileNotFoundError:
                rec["lost"] = "deleted"
                continue
            rec["sha"].update(new)
            rec["size"] += len(new)
            if b"\n" not in rec["head"]:
                rec["head"] = (rec["head"] + new)[:65536]

    # ---- the result

    def result(self) -> dict[str, Any]:
        skip = set(self.events.syncs)
        rows = sorted((r for r in self.rows.values() if r.pid not in skip), key=lambda r: (r.first, r.pid))
        merged = self.events.merge([self._row(r) for r in rows], self.since, skip | {self.me}, self.started)
        reader = self.events.cpu_s()
        return {"node": node_name(), "image": image_identity(self.manifest_path), "gate_pid": self.me,
                "subreaper": self.reaper, "interval_s": self.interval_s, "polls": self.polls,
                "hashes": {"hashed_here": self.components.hashed, "reused": self.components.reused},
                "randomize_va_space": self.aslr, "fanotify": self.events.evidence(),
                "cpu_s": round(self.cpu_s + reader, 3), "cpu_parts": {"thread": round(self.cpu_s, 3),
                                                                      "fanotify": round(reader, 3)},
                "seconds": round(time.monotonic() - self.started, 3),
                "errors": self.errors, "rows": sorted(merged, key=lambda r: (r["first_s"], r["pid"])),
                "records": [self._record(r) for _, r in sorted(self.records.items())]}

    def _row(self, row: Row) -> dict[str, Any]:
        parent = next((r for r in self.rows.values() if r.pid == row.first_ppid and r.first <= row.first), None)
        before = [self.own_image] if row.first_ppid == self.me else parent.images if parent is not None else []
        images = row.images
        fork_copy = len(images) > 1 and any(_same(images[0], b) for b in before)
        if fork_copy:  # a fork that then exec'd: its first image was its parent's, until the exec
            images = images[1:]
        files = sorted({f for i in images for f in i["files"]})
        why = next((i["why"] for i in images if i["why"]), None)
        denied = self.denied.get(row.key())
        return {"pid": row.pid, "starttime": row.starttime, "ppid": row.first_ppid, "exe": row.exe,
                "argv": row.argv, "execs": [{"exe": i["exe"], "argv": i["argv"]} for i in images[:-1]],
                "fork_copy": fork_copy, "python": why is not None, "why": why,
                "images": [{"mark": i["mark"], "why": i["why"], "exe": i["exe"],
                            "component_files": len(i["files"])} for i in images],
                "no_aslr": any(i.get("no_aslr") for i in images), "uid": denied["uid"] if denied else None,
                "unreadable": denied["unreadable"] if denied else [], "component_files": files[:FILES_KEPT],
                "component_file_count": len(files), "first_s": row.first, "last_s": row.last,
                "ended": row.gone or row.state == "Z"}

    @staticmethod
    def _record(rec: dict[str, Any]) -> dict[str, Any]:
        head = rec["head"].split(b"\n", 1)[0].decode("utf-8", "replace")
        return {"record": rec["record"], "size": rec["size"], "lost": rec["lost"], "first_line": head[:4000]}


def _stat_exe(pid: int | str) -> os.stat_result | None:
    try:
        return os.stat(f"/proc/{pid}/exe")
    except OSError:
        return None


def _same(image: dict[str, Any], other: dict[str, Any]) -> bool:
    """The same program: by mark where both have one, else by executable and argv."""
    if image.get("mark") and other.get("mark"):
        return bool(image["mark"] == other["mark"])
    return (image["exe"], image["argv"]) == (other["exe"], other["argv"])


def load_manifest(path: str) -> dict[str, Any]:
    import json

    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data
