"""The lock is bound to the run: read once into a `Lock`, its sha256 in the report, publish and attest refuse a
lock changed since the run, and render / build refuse a lock stale for the pins (no Docker: the refusals come
before any engine or registry call)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from builder import cli
from builder.core.errors import BadInput, PublishError
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.release import attest, trust
from builder.report import document as report_mod
from demo.make_stack import make_stack
from demo.prepare import add_pr_commit, write_local_pins
from tests.hostile_corpus import accepted_report

PROJECT = Path(__file__).resolve().parents[2]
FAKE_BASE = "127.0.0.1:5000/demo/base@sha256:" + "ab" * 32
EXTRA = "extra==1.0 --hash=sha256:" + "0" * 64 + "\n"


def _lock_of(report_json: Path) -> Path:
    return pins_mod.load(report_mod.load(report_json).sources.pins_path).lock_path()


def test_the_lock_is_one_typed_value() -> None:
    lock = lock_record.load(PROJECT / "pins" / "locks" / "demo.lock")
    assert lock.entries and all(e.hashes for e in lock.entries)
    assert lock.build and not lock.runtime  # the demo's wheels are build tools only
    assert [i.name for i in lock.native.inputs] == ["tinykernels"] and lock.native.cmake == ["vllm"]
    assert lock.inputs_sha256 and set(lock.built_for) == {"base", "vllm", "megatron", "verl"}
    assert lock.wheel_key == "".join(ln for ln in lock.text.splitlines(keepends=True)
                                     if not ln.startswith("# for: ")).encode()


def test_a_missing_lock_is_one_line_not_an_empty_one(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"missing.lock: cannot read the lock file: No such file"):
        lock_record.load(tmp_path / "missing.lock")


def test_the_report_binds_the_lock_sha256(tmp_path: Path) -> None:
    _, path = accepted_report(tmp_path)
    report = report_mod.load(path)
    lock = lock_record.load(_lock_of(path))
    assert report.lock_sha256 == lock.sha256 == report.run_manifest.layers()["run"]["lock_sha256"]
    checked = trust.check(report, str(path))
    assert checked is not None and checked[1].sha256 == lock.sha256


@pytest.mark.parametrize("edit", ["append", "upgrade"])
def test_publish_refuses_a_lock_changed_since_the_run_before_any_registry_call(tmp_path: Path, edit: str,
                                                                               capsys: pytest.CaptureFixture[str],
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = accepted_report(tmp_path)
    lock = _lock_of(path)
    text = lock.read_text()
    lock.write_text(text + EXTRA if edit == "append" else text.replace("ninja==1.13.2", "ninja==1.13.3"))
    monkeypatch.setenv("BUILDER_REGISTRY_URL", "http://127.0.0.1:9")  # nothing listens: nothing can be attached
    assert cli.run(["publish", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "lock_sha256: " in err[0] and "not the one the report recorded; refusing to publish" in err[0]


def test_attest_refuses_a_lock_that_is_not_the_runs(tmp_path: Path) -> None:
    _, path = accepted_report(tmp_path)
    report = report_mod.load(path)
    pins = pins_mod.load(report.sources.pins_path)
    lock = lock_record.of(pins)
    prov = attest.provenance(report, pins, lock, Path(report.sources.pins_path).read_bytes())
    assert prov["buildDefinition"]["externalParameters"]["lock"]["sha256"] == lock.sha256
    names = {d["name"] for d in prov["buildDefinition"]["resolvedDependencies"]}
    assert "native:vllm/tinykernels" in names and "ninja==1.13.2" in names
    later = lock_record.parse(lock.text + EXTRA, lock.path)
    with pytest.raises(PublishError, match="changed since the run"):
        attest.provenance(report, pins, later, Path(report.sources.pins_path).read_bytes())


@pytest.fixture(scope="module")
def stack_pins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bound")
    make_stack(root / "demo-stack")
    shutil.copytree(PROJECT / "pins" / "locks", root / "locks")
    return write_local_pins(FAKE_BASE, out=root / "demo.yaml")


@pytest.mark.parametrize("command", ["render", "build", "run"])
def test_a_moved_commit_with_another_native_tag_is_refused_with_the_check_line(
        stack_pins: Path, tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm's PR head moves to a commit whose CMake names tinykernels v0.2.0: the old lock is stale; render,
    build and run refuse it (exit 2, the line `lock --check` prints) before anything is built."""
    root = tmp_path / "w"
    shutil.copytree(stack_pins.parent, root)
    engine = root / "demo-stack" / "tinyengine.git"
    data = yaml.safe_load((root / "demo.yaml").read_text())
    import pygit2

    repo = pygit2.Repository(str(engine))
    head = repo[repo.references[f"refs/pull/{data['components']['vllm']['pr']}/head"].resolve().target]
    text = repo[head.tree["cmake/kernels.cmake"].id].data.decode()
    data["components"]["vllm"]["commit"] = add_pr_commit(engine, data["components"]["vllm"]["pr"], "cmake/kernels.cmake",
                                                         text.replace("v0.1.0", "v0.2.0"), "kernels 0.2.0\n")
    (root / "demo.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    before = (root / "locks" / "demo.lock").read_bytes()
    monkeypatch.setenv("BUILDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")  # a build would fail with 3, not 2
    assert cli.run([command, str(root / "demo.yaml")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert err == [f"error: {root / 'locks' / 'demo.lock'}: stale: native input vllm/tinykernels: GIT_TAG v0.1.0 ->"
                   f" v0.2.0 (../tinykernels.git); run `builder lock {root / 'demo.yaml'}`"], err
    assert (root / "locks" / "demo.lock").read_bytes() == before
    assert not list((tmp_path / "cache").glob("builds/*/context.tar"))


def test_the_fast_check_names_what_the_lock_was_written_for(stack_pins: Path) -> None:
    pins = pins_mod.load(stack_pins)
    lock = lock_record.of(pins)
    assert lock_record.moved(lock, pins) == ["base"]  # FAKE_BASE; the commits are demo.yaml's
    assert json.loads(json.dumps(lock.built_for))["vllm"] == pins.components["vllm"].commit
