"""Per-process evidence, started in every Python process of the image by its start-up hook (PTH_NAME in
site-packages) and inert unless RECORDS_ENV names a directory. Stdlib only; nothing here may import a component.

Each process appends JSON lines to <dir>/<pid>-<ns>.jsonl, one os.write per line, as it goes (so os._exit,
a crash or SIGKILL leave what was seen so far):
  {"kind": "process", pid, ppid, argv, executable, exe, mnt_ns, sys_path, env, forked, time,
   starttime, node, image, mark}                    first line (schema 2 added starttime, node, image;
                                                    schema 3 mark: the program it was written for, mark())
  {"kind": "sys_path", "sys_path": [...]}             whenever sys.path changed since the last line
  {"kind": "module", name, file, realpath, sha256}    each imported component module (RECORDS_MODULES_ENV)
  {"kind": "lib", path, sha256}                       each shared object newly mapped (/proc/self/maps)
  {"kind": "name", "name": ...}                       the multiprocessing process name, once it is set
  {"kind": "exit"}                                    at interpreter exit or os._exit (absent: killed)
Evidence is written at "import" and "ctypes.dlopen" audit events (sys.addaudithook) and at exit.
(node, pid, starttime) is the key the gate's census (acceptance.census) matches the records on: starttime is
/proc/self/stat field 22, node SLURMD_NODENAME or the host name; image is "sha256:<hex>" of the image's manifest
(MANIFEST_ENV, default /opt/delivery/manifest.json) as this process reads it.
"""
import hashlib
import itertools
import json
import os
import sys
import time
from collections.abc import Callable

try:
    from acceptance import procfs
except ImportError:  # `python hook.py install PREFIX` runs by path, before the suite is importable
    import procfs  # type: ignore[no-redef,import-not-found]  # the sibling file: the script's folder is sys.path[0]

RECORDS_ENV = "TRUEPOLICY_PROCESS_RECORDS"
MODULES_ENV = "TRUEPOLICY_PROCESS_MODULES"      # comma-separated top-level component modules
MANIFEST_ENV = "TRUEPOLICY_PROCESS_MANIFEST"    # the image's manifest: its sha256 is the image identity
IMAGE_MANIFEST = "/opt/delivery/manifest.json"
SCHEMA = 3
PTH_NAME = "00-truepolicy-process-hook.pth"
PTH_LINE = (f"import os; os.environ.get({RECORDS_ENV!r}) and __import__('acceptance.hook').hook.start()\n")
HASHES = ".hashes"                              # <dir>/.hashes/<key>: digests shared by the processes

NUMERIC_ENV = ("DEMO_BATCH_INVARIANT", "DEMO_DEVICE", "VLLM_BATCH_INVARIANT", "CUBLAS_WORKSPACE_CONFIG",
               "NVIDIA_TF32_OVERRIDE", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_DEVICE_MAX_CONNECTIONS",
               "PYTHONHASHSEED", "CUDA_LAUNCH_BLOCKING", "NCCL_ALGO", "NCCL_PROTO")
NUMERIC_PREFIXES = ("TORCH_", "TORCHINDUCTOR_", "TRITON_", "VLLM_", "NCCL_", "CUBLAS", "CUDNN_", "NVTE_")


def numeric_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k in NUMERIC_ENV or k.startswith(NUMERIC_PREFIXES)}









def mark(fields: list[str] | None, exe: os.stat_result | None) -> str | None:
    """The program a process runs now: its executable's device and inode, and /proc/<pid>/stat fields 48-51
    (arg_start, arg_end, env_start, env_end), which every exec moves (address-space randomisation) and nothing
    else does. None when either is unreadable."""
    if not fields or len(fields) < 49 or exe is None:
        return None
    return f"{exe.st_dev}:{exe.st_ino}:" + ":".join(fields[45:49])


def mark_of(pid: int | str = "self") -> str | None:
    try:
        exe = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return None
    return mark(procfs.stat_fields(procfs.read(f"/proc/{pid}/stat")), exe)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


def image_identity(manifest: str | None = None) -> str | None:
    """sha256:<hex> of the image's manifest as this process reads it (None: no manifest)."""
    digest = procfs.sha256(manifest or os.environ.get(MANIFEST_ENV) or IMAGE_MANIFEST)
    return f"sha256:{digest}" if digest else None


def shared_digest(directory: str, path: str, st: os.stat_result) -> str:
    """Where the processes of a run keep a file's sha256 (<dir>/.hashes/<key>), keyed by its path, device, inode,
    size and mtime; the gate's census reads them too (acceptance.census), never hashing a file twice."""
    key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return os.path.join(directory, HASHES, hashlib.sha1(repr(key).encode()).hexdigest())


class Recorder:
    def __init__(self, directory: str, roots: set[str]) -> None:
        self.dir, self.roots = directory, roots
        self.fd = -1
        self.pid = 0
        self.busy = False
        self.hashes: dict[tuple[str, int, int, int, int], str | None] = {}
        self._built: dict[str, str] | None = None
        self.reset(forked=False)

    def reset(self, forked: bool) -> None:
        """A new record file for this pid (at start, and in a forked child, which inherits the parent's state)."""
        self.pid = os.getpid()
        self.seen: set[str] = set()
        self.count = 0
        self.libs: set[str] = set()
        self.path: list[str] = list(sys.path)
        self.name: str | None = None
        self.maps_due = True
        if self.fd >= 0:
            os.close(self.fd)
        name = os.path.join(self.dir, f"{self.pid}-{time.monotonic_ns()}.jsonl")
        self.fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        cmdline = procfs.read("/proc/self/cmdline")
        argv = cmdline.rstrip("\0").split("\0") if cmdline else list(getattr(sys, "orig_argv", sys.argv))
        manifest = self.digest(os.environ.get(MANIFEST_ENV) or IMAGE_MANIFEST)
        self.write({"kind": "process", "schema": SCHEMA, "pid": self.pid, "ppid": os.getppid(), "argv": argv,
                    "executable": sys.executable, "exe": procfs.link("/proc/self/exe"),
                    "mnt_ns": procfs.link("/proc/self/ns/mnt"), "sys_path": self.path, "env": numeric_env(),
                    "forked": forked, "time": time.time(), "starttime": procfs.starttime(), "node": node_name(),
                    "mark": mark_of(),
                    "image": f"sha256:{manifest}" if manifest else None})

    def write(self, entry: dict[str, object]) -> None:
        os.write(self.fd, (json.dumps(entry, sort_keys=True) + "\n").encode())

    def digest(self, path: str) -> str | None:
        """sha256 of a file, shared through <dir>/.hashes by every process (keyed by path, inode, size, mtime)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self.hashes:
            return self.hashes[key]
        stored = shared_digest(self.dir, path, st)
        value = (procfs.read(stored) or "").strip() or self.built().get(path) or procfs.sha256(path)
        if value and not os.path.exists(stored):
            os.makedirs(os.path.dirname(stored), exist_ok=True)
            tmp = f"{stored}.{self.pid}"
            with open(tmp, "w") as fh:
                fh.write(value)
            os.replace(tmp, stored)
        self.hashes[key] = value
        return value

    def built(self) -> dict[str, str]:
        """The build's hashes to trust by path (procfs.build_hashes: a read-only image root only), read once, and
        only when a file would be hashed: the first process of a run takes them instead of reading torch's
        libraries, and shares them through <dir>/.hashes like any digest."""
        if self._built is None:
            self._built = {}
            table = procfs.mounts()
            if procfs.read_only_root(table):
                try:
                    with open(os.environ.get(MANIFEST_ENV) or IMAGE_MANIFEST) as fh:
                        self._built = procfs.build_hashes(json.load(fh), table)
                except (OSError, ValueError):
                    pass
        return self._built

    def module(self, name: str, module: object) -> None:
        if name in self.seen or name.partition(".")[0] not in self.roots:
            return
        self.seen.add(name)
        file = getattr(module, "__file__", None)
        real = os.path.realpath(file) if isinstance(file, str) else None
        self.write({"kind": "module", "name": name, "file": file, "realpath": real,
                    "sha256": self.digest(real) if real else None})
        self.maps_due = self.maps_due or bool(real and procfs.is_shared(real))

    def sweep(self, full: bool = False) -> None:
        if os.getpid() != self.pid:
            self.reset(forked=True)
            full = True
        if sys.path != self.path:
            self.path = list(sys.path)
            self.write({"kind": "sys_path", "sys_path": self.path})
        start = 0 if full or len(sys.modules) < self.count else self.count
        self.count = len(sys.modules)
        for name, module in list(itertools.islice(sys.modules.items(), start, None)):
            self.module(name, module)
        for alias in ("__main__", "__mp_main__"):  # `python -m tinyrl.main_ppo` runs it as __main__
            main = sys.modules.get(alias)
            self.module(getattr(getattr(main, "__spec__", None), "name", None) or alias, main)
        if self.maps_due or full:
            self.maps_due = False
            for path in procfs.mapped_libraries(procfs.read("/proc/self/maps") or ""):
                if path not in self.libs:
                    self.libs.add(path)
                    clean = path.removesuffix(" (deleted)")
                    self.write({"kind": "lib", "path": path, "sha256": self.digest(clean) if clean == path else None})
        mp = sys.modules.get("multiprocessing")
        current = getattr(getattr(mp, "current_process", lambda: None)(), "name", None) if mp else None
        if current and current != self.name:
            self.name = current
            self.write({"kind": "name", "name": current})

    def guard(self, func: Callable[..., None], *args: object) -> None:
        """Run func unless already inside it (its own file reads raise audit events); a failure becomes an
        "error" line, which fails the process's evidence, and never reaches the recipe."""
        if self.busy:
            return
        self.busy = True
        try:
            func(*args)
        except Exception as err:  # noqa: BLE001 - recorded; the recipe must run as it would
            try:
                self.write({"kind": "error", "error": f"{err.__class__.__name__}: {err}"})
            except OSError:
                pass
        finally:
            self.busy = False

    def audit(self, event: str, args: tuple[object, ...]) -> None:
        if event == "import":
            self.sweep()
        elif event == "ctypes.dlopen":
            self.maps_due = True  # the library is mapped after the event: read maps at the next one

    def finish(self) -> None:
        self.sweep(full=True)
        self.write({"kind": "exit"})


_recorder: Recorder | None = None


def start() -> None:
    """Called by the start-up hook when RECORDS_ENV is set; never raises (a broken hook must not break Python)."""
    global _recorder
    if _recorder is not None:
        return
    try:
        directory = os.environ[RECORDS_ENV]
        os.makedirs(directory, exist_ok=True)
        roots = {m for m in os.environ.get(MODULES_ENV, "").split(",") if m}
        recorder = _recorder = Recorder(directory, roots)
    except Exception as err:  # noqa: BLE001 - report and stay out of the way
        print(f"acceptance.hook: not recording: {err.__class__.__name__}: {err}", file=sys.stderr)
        return
    import atexit

    sys.addaudithook(lambda event, args: recorder.guard(recorder.audit, event, args))
    os.register_at_fork(after_in_child=lambda: recorder.guard(recorder.sweep))
    atexit.register(lambda: recorder.guard(recorder.finish))
    real_exit = os._exit

    def _exit(code: int) -> None:  # multiprocessing's forked workers end with os._exit: no atexit
        recorder.guard(recorder.finish)
        real_exit(code)

    os._exit = _exit  # type: ignore[assignment]


def install(prefix: str) -> str:
    """Write the start-up hook into the site-packages of an install prefix (the image build: the acceptance
    suite's prefix, copied into the venv); returns its path."""
    import sysconfig

    site = sysconfig.get_path("purelib", vars={"base": prefix, "platbase": prefix})
    os.makedirs(site, exist_ok=True)
    path = os.path.join(site, PTH_NAME)
    with open(path, "w") as fh:
        fh.write(PTH_LINE)
    return path


if __name__ == "__main__":  # python hook.py install PREFIX (stdlib only: runs before the suite is importable)
    if sys.argv[1:2] != ["install"] or len(sys.argv) != 3:
        sys.exit("usage: hook.py install PREFIX")
    print(install(sys.argv[2]))
