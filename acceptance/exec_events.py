"""The gate's side of the census's kernel events (stdlib only): the fanotify reader (acceptance/fanotify.py) runs
in a census container beside the gate and writes what it saw to a file the gate may only read.

wait() at the census's start: the reader's ready line, then one exec of the gate's own (a sync: `true`) that the
reader must report, which proves its marks see this gate's programs. sync() at the end: one more such exec; the
reader answers events in order, so every exec before it is written by then. merge() adds each interpreter the
reader saw to the census's rows (a row the poll also saw says both sources). Without a reader (no settings key:
Slurm, runc; or none came) the census polls alone and `state` says why."""
import json
import os
import shutil
import subprocess
import time
from typing import Any

READY_S = 30.0       # how long the gate waits for the reader's ready line (the census container starts meanwhile)
GONE = -1  # the start time of an exec the reader read only after its process had ended
POLL_FLOOR = ("polling only: an interpreter that lives less than the census's floor (20 ms past its start-up,"
              " docs/gates.md) may be missed")


class ExecEvents:
    """The reader's lines for one recipe run; `state` on, off (never on: polling alone) or lost (on, then no sync)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.state, self.why = "off", "no census container (the runner starts none: Slurm, runc, or settings)"
        self.lines: list[dict[str, Any]] = []
        self.ready: dict[str, Any] = {}
        self.syncs: list[int] = []
        self.offset = 0

    def wait(self) -> None:
        if not self.path:
            return
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            self._read()
            gone = next((e for e in self.lines if e.get("kind") == "unavailable"), None)
            if gone is not None:
                self.why = f"the census container cannot use fanotify: {gone.get('error')}"
                return
            ready = next((e for e in self.lines if e.get("kind") == "ready"), None)
            if ready is not None:
                self.ready = ready
                self.state, self.why = ("on", "") if self._sync() else (
                    "off", "the reader did not see the gate's own exec (its marks miss the gate's mounts)")
                return
            time.sleep(0.02)
        self.why = f"no fanotify reader was ready within {READY_S:.0f} s"

    def sync(self) -> None:
        """At the end: every exec before this one is in the file, or the reader stopped (state lost)."""
        if self.state == "on" and not self._sync():
            self.state, self.why = "lost", "the reader did not report the gate's closing exec: it stopped meanwhile"

    def _sync(self) -> bool:
        true = shutil.which("true") or "/bin/true"
        proc = subprocess.Popen([true], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        proc.wait()
        self.syncs.append(proc.pid)
        self._read()
        return any(e.get("kind") == "exec" and e.get("pid") == proc.pid for e in self.lines)

    def _read(self) -> None:
        assert self.path is not None
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        for line in data[:end].splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                self.lines.append(entry)

    # ---- what the reader saw

    def cpu_s(self) -> float:
        """The census container's CPU seconds at its last line (its cgroup's usage)."""
        return max([float(e.get("cpu_s") or 0.0) for e in self.lines] or [0.0])

    def interpreters(self, since: int, skip: set[int]) -> dict[tuple[int, int], list[dict[str, Any]]]:
        """(pid, starttime) -> each program it ran that the reader judged an interpreter, as census images: from
        the start lines (exe, argv, mark) or, where none came (a static program, a process gone first), the exec."""
        seen: dict[tuple[int, int], dict[str, list[dict[str, Any]]]] = {}
        for e in self.lines:
            pid, start, kind = e.get("pid"), e.get("starttime"), e.get("kind")
            if start is None and kind == "exec":  # read after the process was gone (the watchdog had let it run):
                start = GONE  # the file it exec'd still says it was an interpreter, so it counts (fail closed)
            if (kind in ("exec", "start") and e.get("why") and isinstance(pid, int) and isinstance(start, int)
                    and (start >= since or start == GONE) and pid not in skip):
                seen.setdefault((pid, start), {"exec": [], "start": []})[str(kind)].append(e)
        return {key: [_seen(s, s.get("argv") or [], s.get("mark")) for s in found["start"]]
                or [_seen(x, [], None) for x in found["exec"][-1:]] for key, found in seen.items()}

    def merge(self, rows: list[dict[str, Any]], since: int, skip: set[int], started: float) -> list[dict[str, Any]]:
        """The census rows with the reader's interpreters: a row both saw gains the programs only the reader saw
        (by mark); a process only the reader saw becomes a row of its own. Each row says its source."""
        for row in rows:
            row["source"] = "poll"
        if self.state == "off":
            return rows
        keyed = {(r["pid"], r["starttime"]): r for r in rows}
        for key, images in self.interpreters(since, skip).items():
            both = keyed.get(key)
            if both is not None:
                both["source"] = "poll+fanotify"
                marks = {i.get("mark") for i in both["images"]}
                ran = {i["mark"] for i in images}
                if both["images"] and both["images"][-1].get("mark") not in ran:  # the poll saw it before its exec
                    both["execs"] = [*both.get("execs", []), {"exe": both["exe"], "argv": both["argv"]}]
                    both["exe"], both["argv"] = images[-1]["exe"], images[-1]["argv"]
                both["images"] += [_image(i) for i in images if i["mark"] not in marks]
                both["python"], both["why"] = True, both["why"] or images[0]["why"]
                continue
            last = images[-1]
            first = float(images[0].get("t") or started)
            rows.append({"pid": key[0], "starttime": key[1], "ppid": last.get("ppid"), "exe": last["exe"],
                         "argv": last["argv"], "execs": [{"exe": i["exe"], "argv": i["argv"]} for i in images[:-1]],
                         "fork_copy": False, "python": True, "why": images[0]["why"],
                         "images": [_image(i) for i in images], "no_aslr": False, "uid": None, "unreadable": [],
                         "component_files": [], "component_file_count": 0,
                         "first_s": round(first - started, 3), "last_s": round(first - started, 3), "ended": True,
                         "source": "fanotify"})
        return rows

    def evidence(self) -> dict[str, Any]:
        execs = [e for e in self.lines if e.get("kind") == "exec" and e.get("pid") not in self.syncs]
        return {"state": self.state, "why": self.why or None, "floor": None if self.state == "on" else POLL_FLOOR,
                "marked": self.ready.get("marked") or [], "unmarked": self.ready.get("unmarked") or [],
                "watched": self.ready.get("watched") or [], "execs": len(execs),
                "starts": sum(1 for e in self.lines if e.get("kind") == "start"),
                "errors": [e.get("error") for e in self.lines if e.get("kind") == "error"][:5],
                "cpu_s": round(self.cpu_s(), 3)}


def _seen(line: dict[str, Any], argv: list[str], mark: str | None) -> dict[str, Any]:
    return {"exe": line.get("exe"), "argv": argv, "mark": mark, "why": line["why"], "t": line.get("t"),
            "ppid": line.get("ppid")}


def _image(seen: dict[str, Any]) -> dict[str, Any]:
    return {"mark": seen["mark"], "why": seen["why"], "exe": seen["exe"], "component_files": 0}


def census_events_path(settings: dict[str, Any]) -> str | None:
    """Where the runner's census container writes (settings.census_events), None without one."""
    path = settings.get("census_events")
    return path if isinstance(path, str) and path and os.path.isabs(path) else None
