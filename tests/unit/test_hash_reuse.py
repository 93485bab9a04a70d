"""Attribution never hashes a file again (issue 47): a build-time hash (manifest or RECORD) is trusted by path only on
a read-only image root and for paths no other mount covers; the census takes the hook's digests of the same run (same
path, device, inode, size and mtime); a file on a writable root or mount is hashed where it is read."""
import json
import os
from pathlib import Path
from typing import Any

import pytest

from acceptance import census, hook, processes, procfs

SITE = "/opt/venv/lib/python3.11/site-packages"
TORCH = f"{SITE}/torch/lib/libtorch_cpu.so"


def _mounts(root: str, *others: str) -> list[dict[str, str]]:
    return [{"mount_point": "/", "root": "/", "options": root, "fstype": "overlay", "source": "overlay"},
            *({"mount_point": m, "root": "/", "options": "rw,nosuid", "fstype": "tmpfs", "source": "tmpfs"}
              for m in others)]


def _manifest(files: dict[str, str]) -> dict[str, Any]:
    return {"site_packages": SITE, "components": {"vllm": {"files": files, "native_libs": {}}},
            "native_owners": {TORCH: {"distribution": "torch", "version": "2.11.0", "sha256": "a" * 64}}}


def test_build_hashes_hold_by_path_only_on_a_read_only_root() -> None:
    manifest = _manifest({f"{SITE}/eng/__init__.py": "b" * 64, "/tmp/eng/x.py": "c" * 64})
    assert procfs.build_hashes(manifest, _mounts("ro,relatime", "/tmp")) == {
        f"{SITE}/eng/__init__.py": "b" * 64, TORCH: "a" * 64}  # /tmp is a mount of its own: hashed there
    assert procfs.build_hashes(manifest, _mounts("rw,relatime", "/tmp")) == {}  # Docker's writable root
    assert procfs.build_hashes(manifest, [*_mounts("ro"), *_mounts("rw")[:1]]) == {}  # the last mount on / counts


def test_the_hook_takes_the_build_hash_instead_of_reading_the_file(tmp_path: Path, monkeypatch: Any) -> None:
    lib = tmp_path / "libtorch_cpu.so"
    lib.write_bytes(b"\x7fELF torch")
    (tmp_path / "manifest.json").write_text(json.dumps(_manifest({}) | {"native_owners": {
        str(lib): {"distribution": "torch", "version": "2.11.0", "sha256": "f" * 64}}}))
    monkeypatch.setenv(hook.MANIFEST_ENV, str(tmp_path / "manifest.json"))
    for root, want in (("ro", "f" * 64), ("rw", procfs.sha256(str(lib)))):
        monkeypatch.setattr(procfs, "mounts", lambda text=None, root=root: _mounts(root))
        (tmp_path / f"rec-{root}").mkdir()
        recorder = hook.Recorder(str(tmp_path / f"rec-{root}"), set())
        assert recorder.digest(str(lib)) == want, root  # "f" * 64 is no file's content: the file was not read
        stored = hook.shared_digest(recorder.dir, str(lib), os.stat(lib))
        assert Path(stored).read_text() == want  # shared with the run's other processes and its census
        os.close(recorder.fd)


def test_the_census_takes_the_hook_s_digest_of_the_same_file(tmp_path: Path, monkeypatch: Any) -> None:
    """A copy of a component file in /tmp: the hook's digest of it (same path, device, inode, size, mtime) decides
    without a read; another file of the same size, not hashed by the hook, is hashed by the census."""
    monkeypatch.setattr(procfs, "mounts", lambda text=None: _mounts("rw", "/tmp"))
    component = tmp_path / "site" / "eng.py"
    component.parent.mkdir()
    component.write_text("VALUE = 1\n")
    digest = procfs.sha256(str(component))
    manifest: dict[str, Any] = {"site_packages": str(tmp_path / "site"), "components": {"vllm": {
        "files": {str(component): digest}, "modules": ["eng"]}}}
    records = tmp_path / "records"
    parts = census.Components(manifest)
    census.Census(str(records), parts, str(tmp_path / "manifest.json"))
    assert parts.shared == str(records)
    copy, other = tmp_path / "copy.txt", tmp_path / "other.txt"
    copy.write_text("VALUE = 2\n")  # not the component's bytes: only the stored digest can make it one
    other.write_text("VALUE = 1\n")  # the component's bytes
    stored = Path(hook.shared_digest(str(records), str(copy), os.stat(copy)))
    stored.parent.mkdir(parents=True)
    stored.write_text(str(digest))
    assert parts.same_content(str(copy)) and parts.same_content(str(other))
    assert (parts.reused, parts.hashed) == (1, 1)
    assert parts.same_content(str(copy)) and (parts.reused, parts.hashed) == (1, 1)  # each verdict cached


@pytest.mark.parametrize("root_ro", [True, False])
def test_a_library_is_attributed_by_path_only_on_a_read_only_root(root_ro: bool) -> None:
    """torch's library at its RECORD path with other bytes than RECORD's (rewritten in place): on a read-only root
    that cannot be, and the path decides; on a writable root its digest decides, and it belongs to nothing."""
    rec = {"pid": 5, "argv": ["python"], "mnt_ns": None, "modules": {}, "libs": {TORCH: "e" * 64}}
    failures, listed = processes.judge([rec], _manifest({}), None, ["/tmp"], ["/cache"], root_ro=root_ro)
    if root_ro:
        assert failures == [] and listed[0]["libraries"] == {TORCH: "torch 2.11.0"}
    else:
        assert listed[0]["libraries"] == {TORCH: None} and failures == [
            f"process 5 (python): native library {TORCH} belongs to no distribution of the image and not to the base"]
