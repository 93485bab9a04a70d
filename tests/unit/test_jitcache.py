"""The JIT layer's reader (acceptance/jitcache.py) on a Triton cache laid out as Triton 3.6 writes it
(one folder per cache key: <kernel>.json metadata, .ttir, .cubin, __grp__<kernel>.json), origins judged by
content (a child process writing into the cache between the two listings), and the manifest's JIT layer built
from a recipe gate's evidence."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from acceptance import jitcache
from builder.core.records import Evidence, GateResult
from builder.report import manifest

META = {"hash": "d03d5df4" * 8, "target": {"backend": "cuda", "arch": 90, "warp_size": 32}, "num_warps": 4,
        "num_ctas": 1, "num_stages": 3, "maxnreg": None, "enable_fp_fusion": True, "shared": 2048,
        "default_dot_input_precision": "tf32", "name": "bi_matmul", "debug": False}


def _kernel(cache: Path, name: str, key: str, version: str | None = None) -> Path:
    folder = cache / key
    folder.mkdir(parents=True)
    meta: dict[str, Any] = {**META, "hash": key, "name": name}
    if version:
        meta["triton_version"] = version
    (folder / f"{name}.json").write_text(json.dumps(meta))
    (folder / f"{name}.ttir").write_text(f"module {{ tt.func @{name} }}")
    (folder / f"{name}.cubin").write_bytes(b"\x7fELF" + name.encode())
    (folder / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {}}))
    return folder


def test_kernels_compiled_during_the_run_are_listed_with_their_metadata(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "triton"
    cache.mkdir(parents=True)
    before = jitcache.listing([str(tmp_path / "cache")])
    assert before == {}
    folder = _kernel(cache, "bi_matmul", "aa" * 32, version="3.6.0")
    _kernel(cache, "bi_rms_norm", "bb" * 32)
    (tmp_path / "cache" / "stray.bin").write_bytes(b"x")
    found = jitcache.compiled([str(tmp_path / "cache")], before)
    assert found["at_start"] == {"count": 0, "files": []} and found["count"] == 3 and found["changed"] == 0
    assert found["kernels"] == ["bi_matmul", "bi_rms_norm"]
    matmul = next(e for e in found["entries"] if e.get("kernel") == "bi_matmul")
    assert matmul["cache_key"] == "aa" * 32 and matmul["entry"] == str(folder)
    assert matmul["compiler_version"] == "3.6.0" and matmul["compiler_version_from"] == "cache metadata"
    assert matmul["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert matmul["config"]["num_warps"] == 4 and matmul["config"]["num_stages"] == 3
    assert matmul["ttir_sha256"] == hashlib.sha256(b"module { tt.func @bi_matmul }").hexdigest()
    assert matmul["binary_sha256"] == hashlib.sha256(b"\x7fELFbi_matmul").hexdigest()
    assert matmul["origin"] == "compiled during the run"
    norm = next(e for e in found["entries"] if e.get("kernel") == "bi_rms_norm")
    assert norm["compiler_version_from"] == "installed triton"  # no triton here: None, said so
    stray = next(e for e in found["entries"] if e.get("file"))
    assert stray["compiler"] == "unknown" and stray["origin"] == "written during the run"


def test_an_entry_present_at_start_is_shipped_not_compiled(tmp_path: Path) -> None:
    cache = tmp_path / "triton"
    _kernel(cache, "bi_softmax", "cc" * 32)
    before = jitcache.listing([str(cache)])
    _kernel(cache, "bi_matmul", "dd" * 32)
    found = jitcache.compiled([str(cache)], before)
    assert found["at_start"]["count"] == len(before) == 4
    assert {f["file"]: f["sha256"] for f in found["at_start"]["files"]} == {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in (cache / ("cc" * 32)).iterdir()}
    origins = {e["kernel"]: e["origin"] for e in found["entries"]}
    assert origins == {"bi_softmax": "present at start (shipped in the image)", "bi_matmul": "compiled during the run"}


# a recipe run as a child process: it compiles one kernel, rewrites a shipped kernel's binary in place (same
# path, other bytes), leaves another shipped kernel alone, writes one stray file and rewrites a shipped one
RUN = """
import json, pathlib, sys
cache = pathlib.Path(sys.argv[1])
new = cache / ("ee" * 32)
new.mkdir()
(new / "bi_rms_norm.json").write_text(json.dumps({"name": "bi_rms_norm", "hash": "ee" * 32}))
(new / "bi_rms_norm.cubin").write_bytes(b"fresh")
(cache / ("cc" * 32) / "bi_softmax.cubin").write_bytes(b"recompiled over the shipped one")
(cache / "stray.bin").write_bytes(b"rewritten")
(cache / "new.bin").write_bytes(b"new")
"""


def test_a_run_that_rewrites_a_shipped_entry_is_reported_as_changed(tmp_path: Path) -> None:
    cache = tmp_path / "triton"
    _kernel(cache, "bi_softmax", "cc" * 32)
    _kernel(cache, "bi_matmul", "dd" * 32)
    (cache / "stray.bin").write_bytes(b"shipped")
    before = jitcache.listing([str(cache)])
    shipped = before[str(cache / ("cc" * 32) / "bi_softmax.cubin")]
    assert shipped == hashlib.sha256(b"\x7fELFbi_softmax").hexdigest()
    subprocess.run([sys.executable, "-c", RUN, str(cache)], check=True, timeout=30)
    found = jitcache.compiled([str(cache)], before)
    origins = {e.get("kernel") or Path(e["file"]).name: e["origin"] for e in found["entries"]}
    assert origins == {"bi_softmax": "changed during the run", "bi_matmul": "present at start (shipped in the image)",
                       "bi_rms_norm": "compiled during the run", "stray.bin": "changed during the run",
                       "new.bin": "written during the run"}
    softmax = next(e for e in found["entries"] if e.get("kernel") == "bi_softmax")
    assert softmax["changed"] == [str(cache / ("cc" * 32) / "bi_softmax.cubin")]
    assert softmax["binary_sha256"] == hashlib.sha256(b"recompiled over the shipped one").hexdigest() != shipped
    assert found["changed"] == 2 and found["at_start"]["count"] == 9


def test_a_shipped_entry_that_loses_a_file_is_changed(tmp_path: Path) -> None:
    folder = _kernel(tmp_path, "bi_matmul", "aa" * 32)
    before = jitcache.listing([str(tmp_path)])
    (folder / "bi_matmul.cubin").unlink()
    entry = jitcache.compiled([str(tmp_path)], before)["entries"][0]
    assert entry["origin"] == "changed during the run" and entry["changed"] == [str(folder / "bi_matmul.cubin")]


def test_metadata_that_is_not_a_kernel_is_not_taken_for_one(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("[1, 2]")
    (tmp_path / "y.json").write_text("{broken")
    found = jitcache.compiled([str(tmp_path)], {})
    assert found["kernels"] == [] and {e["compiler"] for e in found["entries"]} == {"unknown"}


def test_the_evidence_stays_bounded(tmp_path: Path) -> None:
    for i in range(jitcache.LIMIT + 5):
        _kernel(tmp_path, "bi_matmul", f"{i:064x}")
    before = jitcache.listing([str(tmp_path)])
    found = jitcache.compiled([str(tmp_path)], before)
    assert found["at_start"]["count"] == 4 * (jitcache.LIMIT + 5) and len(found["at_start"]["files"]) == jitcache.LIMIT
    found = jitcache.compiled([str(tmp_path)], {})
    assert found["count"] == jitcache.LIMIT + 5 and len(found["entries"]) == jitcache.LIMIT


def test_manifest_jit_layer_lists_what_each_recipe_gate_compiled(report_inputs: Any, tmp_path: Path) -> None:
    _, _, _, result = report_inputs()
    _kernel(tmp_path, "bi_matmul", "ee" * 32)
    jit = jitcache.compiled([str(tmp_path)], {})
    gates = [g.model_copy(update={"evidence": g.evidence.model_copy(update={"jit": jit})}) if g.name == "rl_step" else g
             for g in result.gates]
    layer = manifest.jit_layer(result.model_copy(update={"gates": gates}),
                               Evidence(caches_at_start={"/cache/triton": []}))
    assert list(layer["compiled_during_run"]) == ["rl_step"]
    assert layer["compiled_during_run"]["rl_step"]["kernels"] == ["bi_matmul"]
    assert isinstance(gates[0], GateResult)
