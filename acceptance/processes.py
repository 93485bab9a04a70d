"""Judge the per-process records (acceptance.hook) of one recipe run against the image's manifest: pure
functions over parsed records, so they are unit-tested on hand-made ones (a killed worker's partial one too).

A process fails when it imported a component from outside site-packages or from a file the manifest does not
list or hashes differently, mapped a component native library that is not the manifest's (another path or
another build), mapped a shared object from outside the image (a tmpfs or mount, JIT caches aside), ran in
another mount namespace or another image than the gate, or could not record.

compare() holds the records against the gate's own census (acceptance.census): a process that ran a Python
interpreter, or mapped or opened a component's files, and left no record (or lost it during the run) fails;
every other process is a helper, listed under HELPER_RULE."""
import json
import os
from pathlib import Path
from typing import Any

from acceptance import procfs
from acceptance.hook import MANIFEST_ENV, MODULES_ENV, RECORDS_ENV, image_identity

ARGV_CHARS = 240
HELPER_RULE = ("a process needs no record when none of its images (after a fork's copy of its parent, until its exec)"
               " was a Python interpreter (by content: the image's interpreters by device and inode or sha256, an"
               " ELF carrying the Python runtime, the program the dynamic loader mapped, a libpython mapped; or named"
               " python*) and it mapped or opened no component file (the manifest's files and native libraries, a"
               " component module's folder in site-packages), the census could read its exe, maps and fds, and it"
               " ran with address-space randomisation; one seen only after it ended (no executable, no argv) is"
               " listed as unread")


def parse(text: str) -> dict[str, Any]:
    """One process's JSONL record -> {pid, ppid, argv, ..., modules, libs, sys_paths, complete, problems}."""
    rec: dict[str, Any] = {"modules": {}, "libs": {}, "sys_paths": [], "complete": False, "problems": [],
                           "errors": [], "name": None}
    for number, line in enumerate(text.splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError:
            rec["problems"].append(f"line {number} unreadable (cut short?)")
            continue
        kind = entry.get("kind")
        if kind == "process":
            rec.update({k: v for k, v in entry.items() if k != "kind"})
            rec["sys_paths"].append(entry.get("sys_path") or [])
        elif kind == "sys_path":
            rec["sys_paths"].append(entry.get("sys_path") or [])
        elif kind == "module":
            rec["modules"][entry["name"]] = {k: entry.get(k) for k in ("file", "realpath", "sha256")}
        elif kind == "lib":
            rec["libs"][entry["path"]] = entry.get("sha256")
        elif kind == "name":
            rec["name"] = entry.get("name")
        elif kind == "error":
            rec["errors"].append(entry.get("error"))
        elif kind == "exit":
            rec["complete"] = True
    return rec


def load(directory: str) -> list[dict[str, Any]]:
    """Every process record under directory, by start order (pid as the tie-break)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    recs = [parse(p.read_text("utf-8", "replace")) | {"record": p.name} for p in sorted(root.glob("*.jsonl"))]
    return sorted(recs, key=lambda r: (r.get("time") or 0, r.get("pid") or 0))


def command_line(argv: list[Any] | None) -> str:
    """A process's argv for a reason line, clipped at ARGV_CHARS."""
    text = " ".join(str(a) for a in argv or [])
    return text[:ARGV_CHARS] + "..." if len(text) > ARGV_CHARS else text


def who(rec: dict[str, Any]) -> str:
    name = f" {rec['name']}" if rec.get("name") and rec["name"] != "MainProcess" else ""
    return f"process {rec.get('pid')}{name} ({command_line(rec.get('argv'))})"


def _under(path: str, dirs: list[str]) -> str | None:
    return next((d for d in dirs if d and procfs.covers(d.rstrip("/") or "/", path)), None)


def judge_one(rec: dict[str, Any], manifest: dict[str, Any], expected_ns: str | None,
              mounts: list[str], jit_dirs: list[str], image: str | None = None) -> list[str]:
    """Reasons this process fails (empty: it ran only what the manifest lists)."""
    site = (manifest.get("site_packages") or "").rstrip("/")
    comps = manifest.get("components") or {}
    files = {p: d for c in comps.values() for p, d in (c.get("files") or {}).items()}
    native = {p: (n, d) for n, c in comps.items() for p, d in (c.get("native_libs") or {}).items()}
    by_base = {os.path.basename(p): n for p, (n, _) in native.items()}
    by_digest = {d: n for n, c in comps.items() for d in (c.get("native_libs") or {}).values()}
    roots = {f"{site}/{m.split('.')[0]}": n for n, c in comps.items() for m in c.get("modules") or []}
    me, out = who(rec), []
    if rec.get("pid") is None:
        out.append(f"{me}: record {rec.get('record')} has no process line")
    if expected_ns and rec.get("mnt_ns") != expected_ns:
        out.append(f"{me}: mount namespace {rec.get('mnt_ns')}, expected the gate's {expected_ns}")
    if image and "image" in rec and rec["image"] != image:  # schema 1 records carry no image
        out.append(f"{me}: ran in image {rec['image']} (its manifest's sha256), not the gate's {image}")
    for error in rec.get("errors") or []:
        out.append(f"{me}: the start-up hook could not record: {error}")
    for name, mod in sorted((rec.get("modules") or {}).items()):
        real, file = mod.get("realpath"), mod.get("file")
        if not real:
            if "." not in name:
                out.append(f"{me}: component module {name} has no file (namespace or in-memory package)")
            continue
        if not real.startswith(site + "/"):
            out.append(f"{me}: {name} imported from {file}, outside site-packages {site}")
        elif real not in files:
            out.append(f"{me}: {name} imported from {real}, a file the manifest does not list")
        elif mod.get("sha256") != files[real]:
            out.append(f"{me}: {name} file {real} sha256 {mod.get('sha256')} differs from the manifest")
    for path, digest in (rec.get("libs") or {}).items():
        clean = path.removesuffix(" (deleted)")
        owner = _under(clean, list(roots))
        if clean in native:
            if clean != path or digest != native[clean][1]:
                out.append(f"{me}: {native[clean][0]} native library {path} sha256 {digest} differs from the manifest")
        elif owner:
            out.append(f"{me}: {roots[owner]} native library {path} is not in the manifest")
        elif digest and digest in by_digest:  # a component's file by content, under another path or name
            out.append(f"{me}: a copy of {by_digest[digest]}'s native library loaded from {path}, not the manifest's")
        elif os.path.basename(clean) in by_base and not clean.startswith(site + "/"):  # torch/_C...so is torch's
            out.append(f"{me}: another build of {by_base[os.path.basename(clean)]}'s "
                       f"{os.path.basename(clean)} loaded from {path}, not in the manifest")
        elif _under(clean, jit_dirs):
            continue  # compiled during the run into a JIT cache (the JIT layer's business)
        elif clean != path:
            out.append(f"{me}: native library {path} is not in the manifest (its file was deleted)")
        elif where := _under(clean, [m for m in mounts if m != clean]):  # a file mounted as itself: the runtime's
            out.append(f"{me}: native library {path} is not in the manifest (from the mount at {where}, not the image)")
    return out


def owner(path: str, digest: str | None, manifest: dict[str, Any], mounts: list[str], jit_dirs: list[str],
          by_sha: dict[str, dict[str, Any]] | None = None, root_ro: bool = False) -> str | None:
    """Whose a mapped native library is: "<distribution> <version>" (the image's RECORD files: by path only on a
    read-only image root, else by the sha256 the hook took in this container), "jit" (a JIT cache), "base image"
    (on the image root outside site-packages); None: a library in site-packages or on a mount that belongs to no
    distribution. Older manifests (no native_owners) attribute nothing: "unknown"."""
    owners = manifest.get("native_owners")
    if not isinstance(owners, dict):
        return "unknown"
    clean = path.removesuffix(" (deleted)")
    if _under(clean, jit_dirs):
        return "jit"
    mounted = _under(clean, [m for m in mounts if m != clean])
    entry = owners.get(clean) if root_ro and not mounted and clean == path else None
    if entry is None and digest:
        by_sha = by_sha if by_sha is not None else {str(e.get("sha256")): e for e in owners.values()}
        entry = by_sha.get(digest)
    if entry is not None:
        return f"{entry.get('distribution')} {entry.get('version')}"
    site = (manifest.get("site_packages") or "").rstrip("/")
    return None if mounted or clean != path or (site and clean.startswith(site + "/")) else "base image"


def judge(recs: list[dict[str, Any]], manifest: dict[str, Any], expected_ns: str | None,
          mounts: list[str], jit_dirs: list[str], image: str | None = None,
          root_ro: bool = False) -> tuple[list[str], list[dict[str, Any]]]:
    """(failures over every process, the process list for the report); `root_ro`: the image root is mounted
    read-only, so a RECORD's hash holds by path (procfs.build_hashes)."""
    failures, listed = [], []
    owners = manifest.get("native_owners")
    by_sha = {str(e.get("sha256")): e for e in owners.values()} if isinstance(owners, dict) else {}
    for rec in recs:
        reasons = judge_one(rec, manifest, expected_ns, mounts, jit_dirs, image)
        libraries = {p: owner(p, d, manifest, mounts, jit_dirs, by_sha, root_ro) for p, d in (rec.get("libs") or {}).items()}
        reasons += [f"{who(rec)}: native library {p} belongs to no distribution of the image and not to the base"
                    for p, o in libraries.items() if o is None and not any(p in r for r in reasons)]
        failures += reasons
        listed.append({"pid": rec.get("pid"), "ppid": rec.get("ppid"), "name": rec.get("name"),
                       "starttime": rec.get("starttime"), "node": rec.get("node"), "image": rec.get("image"),
                       "record": rec.get("record"), "mark": rec.get("mark"),
                       "forked": bool(rec.get("forked")),  # a forked child shows its parent's argv
                       "argv": rec.get("argv"), "executable": rec.get("executable"), "mnt_ns": rec.get("mnt_ns"),
                       "sys_path": (rec.get("sys_paths") or [[]])[-1], "env": rec.get("env") or {},
                       "modules": {n: m.get("realpath") for n, m in sorted((rec.get("modules") or {}).items())},
                       "libs": len(rec.get("libs") or {}), "libraries": libraries,
                       "library_sha256": {p: d for p, d in (rec.get("libs") or {}).items()
                                          if libraries.get(p) not in (None, "base image", "jit", "unknown")},
                       "complete": rec.get("complete"),
                       "problems": rec.get("problems") or [], "status": "fail" if reasons else "pass",
                       "failures": reasons[:5]})
    if not recs:
        failures.append("no process records: the image's start-up hook did not run in the recipe")
    return failures, listed


def _manifest(settings: dict[str, Any]) -> dict[str, Any]:
    with open(settings.get("manifest", "/opt/delivery/manifest.json")) as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def recording_env(settings: dict[str, Any], directory: str) -> dict[str, str]:
    """The variables that turn the image's start-up hook on for the recipe: where to write, which modules count."""
    try:
        comps = _manifest(settings).get("components") or {}
    except (OSError, ValueError):
        comps = {}  # check() names the unreadable manifest
    modules = sorted({m.split(".")[0] for c in comps.values() for m in c.get("modules") or []})
    return {RECORDS_ENV: directory, MODULES_ENV: ",".join(modules),
            MANIFEST_ENV: settings.get("manifest", "/opt/delivery/manifest.json")}


def check(directory: str, settings: dict[str, Any], lost: set[str] | frozenset[str] = frozenset()
          ) -> tuple[list[str], list[dict[str, Any]]]:
    """Judge the records of a finished run from inside the gate's container; `lost`: record files the census
    saw deleted or rewritten during the run (they count as no record, acceptance.census)."""
    try:
        manifest = _manifest(settings)
    except (OSError, ValueError) as err:
        return [f"manifest {settings.get('manifest')} missing or unreadable: {err}"], []
    expected = os.readlink("/proc/self/ns/mnt")
    table = procfs.mounts()
    mounts = [m["mount_point"] for m in table if m["mount_point"] != "/"]
    jit = [settings.get("cache_dir", "/cache")]
    image = image_identity(settings.get("manifest", "/opt/delivery/manifest.json"))
    return judge([r for r in load(directory) if r["record"] not in lost], manifest, expected, mounts, jit, image,
                 procfs.read_only_root(table))


# ---- the census against the records


def _short(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in ("node", "pid", "starttime", "ppid", "exe", "argv", "class", "why", "record",
                                    "lost", "uid", "source")}


def _who(node: str, row: dict[str, Any]) -> str:
    return f"node {node} process {row['pid']} ({row.get('exe')}: {command_line(row.get('argv'))})"


def _source(row: dict[str, Any]) -> str:
    """Which look saw it, where the census had kernel events too: ' (seen by fanotify)'."""
    return f" (seen by {row['source']})" if row.get("source") and row["source"] != "poll" else ""


def _lost_by_process(records: list[dict[str, Any]]) -> dict[tuple[Any, Any], dict[str, Any]]:
    """{(pid, starttime): the census's entry} for each record lost during the run, by its process line."""
    out = {}
    for rec in records:
        if not rec.get("lost"):
            continue
        try:
            head = json.loads(rec.get("first_line") or "")
        except ValueError:
            head = None
        if isinstance(head, dict) and head.get("kind") == "process":
            out[(head.get("pid"), head.get("starttime"))] = rec
        elif str(rec.get("record")).partition("-")[0].isdigit():  # gone before its first line was read: <pid>-*.jsonl
            out[(int(str(rec["record"]).partition("-")[0]), None)] = rec
    return out


def _unmarked(node: str, row: dict[str, Any], recs: list[dict[str, Any]]) -> list[str]:
    """A record belongs to the program it was written for (its mark): each program the process ran that is an
    interpreter or used component files needs a record with its mark. Records without marks (schema 1-2) and
    programs the census could not mark are judged by (pid, starttime) alone."""
    marks = {r.get("mark") for r in recs if r.get("mark")}
    if not marks:
        return []
    out = []
    for image in row.get("images") or []:
        if image.get("mark") and image["mark"] not in marks and (image.get("why") or image.get("component_files")):
            out.append(f"census: {_who(node, row)} exec'd {image.get('exe')} after its record (that program, mark"
                       f" {image['mark']}, is {image.get('why') or 'using component files'} and left no record)")
    return out


def compare(census: dict[str, Any], listed: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """(failures, the census evidence): every process the census saw against the records kept (`listed`, from
    judge()), matched on (node, pid, starttime); a schema 1 record (no node, no starttime) matches on pid."""
    node = str(census.get("node"))
    lost = _lost_by_process(census.get("records") or [])
    failures: list[str] = []
    seen, unrecorded, helpers = [], [], []
    matched: set[int] = set()
    fanotify = census.get("fanotify") or {}
    if fanotify.get("state") == "lost":
        failures.append(f"census: node {node}'s fanotify reader stopped during the run ({fanotify.get('why')}):"
                        " a short process after that may have gone unseen")
    if str(census.get("randomize_va_space")) == "0":
        failures.append(f"census: node {node} runs with kernel.randomize_va_space 0: a record cannot be told from a"
                        " later exec of the same program, so no process is accounted for")
    for census_row in census.get("rows") or []:
        row = {"node": node, "image": census.get("image"), **census_row}
        pid, start = row["pid"], row["starttime"]
        mine = [i for i, r in enumerate(listed) if r.get("pid") == pid
                and r.get("starttime") in (None, start) and r.get("node") in (None, node)]
        found = mine[0] if mine else None
        matched.update(mine)
        gone = lost.get((pid, start)) or lost.get((pid, None))
        row["record"] = listed[found].get("record") if found is not None else None
        row["lost"] = f"record {gone['record']} {gone['lost']}" if gone else None
        if row.get("unreadable"):
            row["class"] = "unreadable"
            seen.append(row)
            unrecorded.append(_short(row))
            failures.append(f"census: node {node} process {pid} (uid {row.get('uid')}: {command_line(row.get('argv'))})"
                            f" could not be read (its {', '.join(row['unreadable'])}: permission denied), so it is"
                            " unaccounted")
            continue
        if row.get("no_aslr"):
            failures.append(f"census: {_who(node, row)} ran with ADDR_NO_RANDOMIZE (its personality): its record"
                            " cannot be told from a later exec of the same program, so it is unaccounted")
        if not row.get("exe") and not row.get("argv"):
            row["class"] = "unread"
        elif row.get("python"):
            row["class"] = "python"
        elif row.get("component_file_count"):
            row["class"] = "component files"
        else:
            row["class"] = "helper"
        seen.append(row)
        if row["class"] in ("helper", "unread"):
            helpers.append(_short(row))
        elif found is None:
            unrecorded.append(_short(row))
            what = ("ran a Python interpreter" if row["class"] == "python" else
                    f"mapped or opened component files ({', '.join(row['component_files'][:2])})")
            why = f"its {row['lost']} during the run" if gone else "it left no process record"
            failures.append(f"census: {_who(node, row)} {what}, and {why}{_source(row)}")
        elif unmarked := _unmarked(node, row, [listed[i] for i in mine]):
            unrecorded.append(_short(row))
            failures += unmarked
    nodes: dict[str, dict[str, Any]] = {node: {"seen": seen, "recorded": [], "unrecorded": unrecorded,
                                               "helpers": helpers}}
    for i, rec in enumerate(listed):
        where = str(rec.get("node") or node)
        entry = nodes.setdefault(where, {"seen": [], "recorded": [], "unrecorded": [], "helpers": []})
        entry["recorded"].append({"pid": rec.get("pid"), "starttime": rec.get("starttime"), "record": rec.get("record"),
                                  "image": rec.get("image"), "seen": i in matched})
    evidence = {k: census.get(k) for k in ("node", "image", "interval_s", "polls", "cpu_s", "cpu_parts", "seconds",
                                          "subreaper", "errors", "randomize_va_space", "fanotify")}
    evidence.update({"rule": HELPER_RULE, "nodes": nodes,
                     "records_lost": [r for r in census.get("records") or [] if r.get("lost")]})
    evidence["hashes"] = census.get("hashes")  # component-sized files the census hashed itself, or took as hashed
    return failures, evidence
