"""The fault matrix: each stage x each fault it can meet, injected while the builder (a subprocess) holds at
a fail point inside that stage (builder/core/faults.py), on parts of its own (tests/faultstack.py): a second
dockerd, a docker-registry behind a fault proxy, an ext4 loop disk for the cache and run directories.

Every cell must end with exit 3, 1 or 130 (SIGKILL: killed) and one `error:` line, no traceback; no release tag
moved but the SHA tag (promote moves it first, holds before the moving tag, and rolls back; a SIGKILL leaves the
journal, whose rerun finishes the tags: docs/release.md); no container left on the engine; no partial file in the
cache or the run directories; and the same command run again must succeed. The table of every cell is
written to $BUILDER_FAULT_TABLE (default: fault-matrix.md in the pytest base temp directory).

Bounded: 53 cells; each run waits at most RUN_TIMEOUT_S, a rerun at most RERUN_TIMEOUT_S. Over 60 s for a few
cells under load (the export cells: the run and its rerun each unpack the 1.3 GB image and squash it; the stack's
set-up builds the demo cold on its own engine).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from builder.core import files as fs
from builder.engine import client as engine_client
from builder.engine.registry import Registry
from builder.release import sqsh, sqsh_trees
from tests import faultstack
from tests.conftest import SETTINGS

pytestmark = [pytest.mark.slow, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[2]
HOLD_TIMEOUT_S = 420      # to reach the fail point
RUN_TIMEOUT_S = 300       # from the fault to the exit
RERUN_TIMEOUT_S = 900
RESTART_GAP_S = 2.0       # a "restart": down at the fail point, back this long after the run goes on
ENGINE_FAULTS = ("engine stop", "engine restart")
REGISTRY_FAULTS = ("registry stop", "registry restart", "registry 500", "registry truncated")
SIGNALS = ("SIGTERM", "SIGKILL")
DISK = ("disk full",)

# stage -> (command kind, fail point, faults it can meet)
STAGES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "resolve": ("resolve", "resolve vllm", DISK + SIGNALS),
    "lock": ("lock", "lock: read the base", ENGINE_FAULTS + DISK + SIGNALS),
    "build": ("build", "docker build", ENGINE_FAULTS + DISK + SIGNALS),
    "normalise": ("build", "normalise", ENGINE_FAULTS + DISK + SIGNALS),
    "stage push": ("accept", "push", REGISTRY_FAULTS + SIGNALS),
    "pull": ("accept", "pull", REGISTRY_FAULTS + ENGINE_FAULTS + SIGNALS),
    "gate": ("accept", "gate provenance", ENGINE_FAULTS + DISK + SIGNALS),
    "promote": ("publish", "promote tag 1", REGISTRY_FAULTS + SIGNALS),  # between the SHA tag and the moving tag
    "attest": ("attest", "attest", REGISTRY_FAULTS + SIGNALS),
    # apply layers: every export runs it (a warm one reads its layers from the build's store, no docker save)
    "export-sqsh": ("export", "sqsh: apply layers", ("engine stop", "disk full") + SIGNALS),
}
# A warm export reads its layers from the build's blob store and smokes with runc: its one use of the engine is the
# base's layers at the start, where the engine cell stops it. The disk cell smokes on its rerun (the smoke after a
# fault: it unpacks and runs a gate on the same disk); the engine cell and the signals run --no-smoke (the smoke
# never meets the engine, and the signals hit before it)
SMOKED = ("disk full",)
FAILPOINT_FOR = {("export-sqsh", "disk full"): "sqsh: mksquashfs", ("export-sqsh", "engine stop"): "sqsh: base layers"}
CELLS = [(stage, fault) for stage, (_, _, faults) in STAGES.items() for fault in faults]
PARTIAL = re.compile(r"(\.part|\.partial|\.tmp)$|^tmp_pack_|^incoming-")
RESULTS: list[dict[str, Any]] = []


@dataclass
class Stack:
    root: Path
    disk: faultstack.LoopDisk
    registry: faultstack.Registry
    proxy: faultstack.FaultProxy
    engine: faultstack.Engine
    cache: Path
    runs: Path
    pins: Path = Path()
    key: Path = Path()
    report_dir: Path = Path()
    repository: str = ""
    tags: list[str] = field(default_factory=list)
    old_manifest: bytes = b""
    base_diff_ids: list[str] = field(default_factory=list)

    def env(self, failpoint: str = "", hold: Path | None = None, key: bool = False) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BUILDER_", "DOCKER_"))}
        env.update(BUILDER_CACHE=str(self.cache), DOCKER_HOST=self.engine.url, PYTHONPATH=str(ROOT),
                   BUILDER_SQUASH_OPTIONS="-noI -noD -noF -noX", BUILDER_REGISTRY_TIMEOUT="20")
        if failpoint:
            env.update(BUILDER_FAILPOINT=failpoint, BUILDER_FAILPOINT_HOLD=str(hold))
        if key:
            env["BUILDER_SIGNING_KEY"] = str(self.key)
        return env

    def release_tags(self) -> dict[str, str | None]:
        host, _, name = self.repository.partition("/")
        reg = Registry(self.proxy.host)
        return {tag: reg.tag_digest(name, tag) for tag in self.tags}

    def reset_release_tags(self) -> None:
        """The release tags serve an older image (the base) before each promote cell."""
        name = self.repository.partition("/")[2]
        for tag in self.tags:
            Registry(self.proxy.host).put_manifest(name, tag, self.old_manifest, faultstack.MANIFEST_TYPES[0])


def builder(*args: str, env: dict[str, str], timeout: float = RERUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def stack(base_image: str, demo_pins: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Engine, registry + proxy, loop disk; the demo base copied into the registry; pins that build on it;
    one accepted, signed report to publish and export."""
    from demo.prepare import variant_pins

    if os.geteuid() != 0 or not shutil.which("dockerd") or not Path(faultstack.REGISTRY_BIN).exists():
        pytest.skip("the fault matrix needs root, dockerd and docker-registry")
    root = Path(tempfile.mkdtemp(prefix="fm-", dir="/tmp"))  # short: the engine's unix socket path
    for part in ("reg", "dk"):
        (root / part).mkdir()
    disk = faultstack.LoopDisk(root, "12G")
    registry = faultstack.Registry(root / "reg")
    registry.start()
    proxy = faultstack.FaultProxy(registry.port)
    engine = faultstack.Engine(root / "dk")
    world = Stack(root, disk, registry, proxy, engine, disk.mount / "cache", disk.mount / "runs")
    try:
        engine.start()
        world.runs.mkdir()
        for parts in (("wheels", "lock"), ("lock",)):  # the demo wheelhouse and lock metadata: no index needed
            if SETTINGS.cache_root.joinpath(*parts).is_dir():
                copy_settled(SETTINGS.cache_root.joinpath(*parts), world.cache.joinpath(*parts))
        world.base_diff_ids = sqsh.base_layers(engine_client.connect(SETTINGS), base_image)
        base_repo, _, digest = base_image.partition("@")
        src_host, _, src_name = base_repo.partition("/")
        faultstack.copy_image(src_host, src_name, digest, proxy.host, "faults/base", root)
        world.repository = f"{proxy.host}/faults/unified"

        def edit(data: dict[str, Any]) -> None:
            data["base"]["image"] = f"{proxy.host}/faults/base@{digest}"
            data["image"] = {"repository": world.repository, "tags": ["fault"]}
            data["acceptance"]["required_gates"] = ["provenance"]
            data["acceptance"].pop("performance", None)  # naming it would make it required

        world.pins = variant_pins(root / "pins", edit=edit, pins_path=demo_pins)  # demo_pins: the stack exists
        world.key = root / "key.pem"
        assert builder("keygen", str(world.key), env=world.env()).returncode == 0
        world.report_dir = world.runs / "accepted"
        first = builder("accept", str(world.pins), "--engine", engine.url, "--gate", "provenance", "--out",
                        str(world.report_dir), env=world.env(key=True), timeout=1800)
        assert first.returncode == 0, first.stderr[-3000:]
        report = json.loads((world.report_dir / "report.json").read_text())
        world.tags = report["tags"]
        reg = Registry(proxy.host)
        world.old_manifest = reg.manifest_by_digest("faults/base", digest)
        for desc in [*json.loads(world.old_manifest)["layers"], json.loads(world.old_manifest)["config"]]:
            assert reg.mount_blob("faults/unified", desc["digest"], "faults/base")
        world.reset_release_tags()
        yield world
    finally:
        write_table(tmp_path_factory)
        proxy.close()
        engine.close()
        registry.stop()
        disk.close()
        shutil.rmtree(root, ignore_errors=True)


def copy_settled(src: Path, dst: Path) -> None:
    """Copy a folder of the session's cache that other workers may be writing into (a cold CI run downloads the
    demo wheelhouse while the stack starts): each entry whose writer's lock (`.<name>.lock`, builder/lock/wheels.py)
    exists is copied under that lock; part files and locks stay behind, or every cell would find them partial."""
    def unfinished(_: str, names: list[str]) -> set[str]:
        return {n for n in names if partial(n) or n.endswith(".lock")}

    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        if partial(entry.name) or entry.name.endswith(".lock"):
            continue
        lock = src / f".{entry.name}.lock"
        with fs.locked(lock, exclusive=False) if lock.exists() else contextlib.nullcontext():
            if entry.is_dir():
                shutil.copytree(entry, dst / entry.name, ignore=unfinished)
            elif entry.exists():
                shutil.copy2(entry, dst / entry.name)


def command(world: Stack, stage: str, fault: str, out: Path) -> tuple[list[str], bool]:
    """The builder command of a stage's cells (run in `out`), and whether it signs."""
    kind = STAGES[stage][0]
    pins = str(world.pins)
    if kind == "resolve":
        return ["resolve", pins], False
    if kind == "lock":
        return ["lock", pins, "--check"], False  # local file:// repositories only; native inputs need their mirror
    if kind == "build":
        return ["build", pins, "--quiet"], False
    if kind == "accept":
        return ["accept", pins, "--engine", world.engine.url, "--gate", "provenance", "--out", str(out / "run")], False
    report = out / "report"
    if not report.exists():
        shutil.copytree(world.report_dir, report)
    if kind == "publish":
        return ["publish", str(report / "report.json")], False
    if kind == "attest":
        return ["publish", str(report / "report.json"), "--key", str(world.key)], True
    smoke = [] if fault in SMOKED else ["--no-smoke"]
    return ["export-sqsh", str(report / "report.json"), "--out", str(out / "image.sqsh"), *smoke], False


def prepare(world: Stack, stage: str) -> None:
    """Make the stage do real work this time (its caches would skip it)."""
    if stage == "resolve":
        for part in ("exports", "mirrors"):
            shutil.rmtree(world.cache / part, ignore_errors=True)
    if stage == "lock":  # the base query is cached per digest: without it the lock may never meet the engine
        shutil.rmtree(world.cache / "lock" / "base", ignore_errors=True)
    if stage == "normalise":
        shutil.rmtree(world.cache / "oci" / "records", ignore_errors=True)
    if stage in ("promote", "attest"):
        world.reset_release_tags()
    if stage == "export-sqsh":  # an export of the same digest would be a cache hit (builder/release/sqsh.py)
        shutil.rmtree(world.cache / "sqsh" / "exports", ignore_errors=True)
        seed_base_tree(world)


def seed_base_tree(world: Stack) -> None:
    """The base's kept tree from the session's cache, once, when another test's export kept it: the cells are about
    faults, not about a cold export (each cold one saves and unpacks the whole image twice). Layers are content-
    addressed, so the tree of the same diff IDs is the same on any engine; without one the first cell goes cold."""
    key = sqsh_trees.key(world.base_diff_ids)
    src, dest = SETTINGS.cache_root / "sqsh" / "trees" / key, world.cache / "sqsh" / "trees" / key
    if not world.base_diff_ids or dest.exists() or not (src / "tree.json").is_file():
        return
    copy = dest.with_name(f"seed-{key}")  # a name no cell counts as partial: it is gone before the cell starts
    try:
        subprocess.run(["cp", "-a", str(src), str(copy)], check=True, capture_output=True, timeout=300)
        copy.rename(dest)
    except (OSError, subprocess.SubprocessError):  # evicted by the session meanwhile: this cell goes cold
        shutil.rmtree(copy, ignore_errors=True)


def partial(name: str) -> bool:
    """A file or folder name that a writer has not finished (its own suffixes, or the builder's part names)."""
    return bool(PARTIAL.search(name) or fs.PART_RX.match(name))


def partial_files(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in filenames + dirnames:
                if partial(name):
                    found.append(os.path.join(dirpath, name))
    return sorted(found)


def inject(world: Stack, fault: str, proc: subprocess.Popen[str]) -> None:
    """The part of the fault that happens while the builder holds at the fail point."""
    if fault.startswith("engine"):
        world.engine.stop()
    elif fault in ("registry stop", "registry restart"):
        world.registry.stop()
    elif fault == "registry 500":
        world.proxy.set_mode("500")
    elif fault == "registry truncated":
        world.proxy.set_mode("truncate")
    elif fault == "disk full":
        world.disk.fill()
    elif fault in SIGNALS:
        proc.send_signal(getattr(signal, fault))


def heal(world: Stack) -> None:
    world.proxy.set_mode("pass")
    world.disk.drain()
    world.registry.start()
    world.engine.start()


@pytest.mark.parametrize("stage, fault", CELLS, ids=[f"{s}-{f}".replace(" ", "_") for s, f in CELLS])
def test_fault_cell(stack: Stack, stage: str, fault: str, tmp_path: Path) -> None:
    out = stack.runs / f"{stage}-{fault}".replace(" ", "_")
    out.mkdir()
    argv, key = command(stack, stage, fault, out)
    prepare(stack, stage)
    tags_before = stack.release_tags()
    hold = stack.root / "hold"
    hold.touch()
    failpoint = FAILPOINT_FOR.get((stage, fault), STAGES[stage][1])
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "builder", *argv], cwd=ROOT, text=True,
                            env=stack.env(failpoint, hold, key), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []
    reached = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith(f"failpoint {failpoint}"):
                reached.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    row: dict[str, object] = {"stage": stage, "fault": fault}
    RESULTS.append(row)
    try:
        while not reached.wait(0.5):
            if proc.poll() is not None or time.monotonic() - start > HOLD_TIMEOUT_S:
                proc.kill()
                pytest.fail(f"never reached fail point {failpoint!r} (exit {proc.poll()}):\n" + "\n".join(lines[-30:]))
        inject(stack, fault, proc)
        hold.unlink()
        if fault.endswith("restart"):
            time.sleep(RESTART_GAP_S)
            heal(stack)
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            pytest.fail(f"no exit within {RUN_TIMEOUT_S} s after the fault:\n" + "\n".join(lines[-30:]))
        reader.join(timeout=10)
    finally:
        hold.unlink(missing_ok=True)
        heal(stack)
    errors = [ln for ln in lines if ln.startswith("error:")]
    left_now = stack.engine.containers()
    partial_now = partial_files(stack.cache, stack.runs)
    tags_after = stack.release_tags()
    moved = sorted(t for t in stack.tags if tags_after[t] != tags_before[t])
    rerun = builder(*argv, env=stack.env(key=key))
    left_after = stack.engine.containers()
    partial_after = partial_files(stack.cache, stack.runs)
    row.update(rc=rc, line=errors[0][:160] if errors else "", tags_moved=", ".join(moved) or "none",
               containers_left=len(left_now), partial_left=len(partial_now), rerun=rerun.returncode,
               after_rerun=f"{len(left_after)} containers, {len(partial_after)} partial",
               seconds=round(time.monotonic() - start, 1))
    killed = fault == "SIGKILL"
    if killed:
        assert rc == -signal.SIGKILL, row
    else:
        assert rc == 130 if fault == "SIGTERM" else rc in (1, 3), row
    assert not any("Traceback" in ln for ln in lines), "\n".join(lines[-40:])
    assert len(errors) == (0 if killed else 1), errors or lines[-20:]
    if stage == "attest":  # promote had finished: all tags on the new digest, or all rolled back
        assert len(set(tags_after.values())) == 1, row
    elif stage == "promote":  # held before the moving tag: the SHA tag moved first, a moving tag never before it
        assert set(moved) <= {stack.tags[0]}, f"a moving tag moved before the SHA tag: {row}"
        if fault in ("SIGTERM", "registry restart"):  # a reachable registry gets every moved tag back
            assert moved == [], row
    else:
        assert moved == [], row
    if not killed and not fault.startswith("engine"):
        assert left_now == [], f"containers left: {left_now}"
    if not killed:
        assert partial_now == [], partial_now
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert left_after == [] and partial_after == [], (left_after, partial_after)
    if stage in ("promote", "attest"):
        served = set(stack.release_tags().values())
        assert len(served) == 1 and None not in served, served
    if stage == "export-sqsh":  # the rerun's record: smoked where the cell asked for it
        smoke = json.loads((out / "report" / "report.json").read_text())["sqsh"]["smoke"]
        assert smoke["status"] == ("pass" if fault in SMOKED else "not_run"), smoke
    shutil.rmtree(out)  # a passed cell's output goes (an export cell's .sqsh is gigabytes); a failed one's stays


def write_table(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not RESULTS:
        return
    path = Path(os.environ.get("BUILDER_FAULT_TABLE") or tmp_path_factory.getbasetemp() / "fault-matrix.md")
    head = ["stage", "fault", "rc", "line", "tags_moved", "containers_left", "partial_left", "rerun", "after_rerun",
            "seconds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in RESULTS:
        rows.append("| " + " | ".join(str(r.get(k, "")).replace("|", "/") for k in head) + " |")
    path.write_text(f"{len(RESULTS)} cells\n\n" + "\n".join(rows) + "\n")
