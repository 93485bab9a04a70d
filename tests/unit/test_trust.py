"""builder/release/trust.py (publish believes evidence), reference grammar and pip reading: the rules one by one.
The generated corpus (test_hostile_corpus.py) runs the same rules end to end through the CLI."""
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.core import imageref as reference
from builder.core.errors import BadInput
from builder.core.records import Evidence, GateResult, Report
from builder.lock import record as lock_record
from builder.pins import allowlist
from builder.pins import model as pins_mod
from builder.release import trust
from builder.report import document as report
from tests.fixture_types import MakeReportInputs
from tests.hostile_corpus import DEMO, LOCK, accepted_report


def _load(path: Path) -> Report:
    return report.load(path)


def test_unedited_report_passes_and_returns_the_pins(tmp_path: Path) -> None:
    _, path = accepted_report(tmp_path)
    checked = trust.check(_load(path), str(path))
    assert checked is not None and checked[0].sha256 == _load(path).sources.pins_sha256
    assert checked[1].sha256 == _load(path).lock_sha256


def test_not_accepted_report_is_left_to_publish(tmp_path: Path) -> None:
    data, path = accepted_report(tmp_path)
    data["verdict"] = "NOT ACCEPTED"
    path.write_text(json.dumps(data))
    assert trust.check(_load(path), str(path)) is None


@pytest.mark.parametrize("gate,evidence,why", [
    ("provenance", {"failures": []}, None),
    ("provenance", {"failures": ["x"]}, "failures"),
    ("zero_update", {"exit_code": 0, "weights": ["a"], "steps": {"1": {"diff_max": 0.0, "k3_kl": 0}}}, None),
    ("zero_update", {"exit_code": 0, "weights": ["a"], "steps": {"1": {"diff_max": -0.0, "k3_kl": 1e-300}}}, "k3_kl"),
    ("zero_update", {"exit_code": 0, "weights": ["a"], "steps": {"1": {"diff_max": True, "k3_kl": 0}}}, "diff_max"),
    ("rl_step", {"exit_code": 0, "steps": {"1": {"diff_max": 0, "k3_kl": 0, "reward": 1, "loss": 1,
                                                 "weights_before": "a", "weights_after": "b"}}}, None),
    ("rl_step", {"exit_code": 0, "steps": {"1": {"diff_max": 0, "k3_kl": 0, "reward": 1, "loss": float("nan"),
                                                 "weights_before": "a", "weights_after": "b"}}}, "loss"),
    ("control", {"exit_code": 0, "diff_max": 1e-9}, None),
    ("control", {"exit_code": 0, "diff_max": float("inf")}, "diff_max"),
    ("unknown_gate", {"exit_code": 0}, "no rule"),
])
def test_derive_from_evidence(gate: str, evidence: dict[str, Any], why: str | None) -> None:
    got = trust.derive(GateResult(name=gate, status="pass", reason="", evidence=Evidence.model_validate(evidence)), steps=1)
    assert (got is None) if why is None else (got is not None and why in got), got


def _perf_runs(aligned: list[int], control: list[int], status: str = "pass") -> dict[str, Any]:
    return {"runs": [{"run": i, "arm": arm, "status": status, "throughput": value}
                     for i, (a, c) in enumerate(zip(aligned, control), 1) for arm, value in (("aligned", a), ("control", c))]}


@pytest.mark.parametrize("evidence,why", [
    (_perf_runs([450, 460, 440], [1000, 1000, 1000]), None),
    (_perf_runs([100, 110, 105], [1000, 1000, 1000]), "the runs read fail"),  # a slow path relabelled pass
    (_perf_runs([200, 460, 1500], [1000, 1000, 1000]), "the runs read inconclusive"),  # noisy: 0.2 to 1.5, open
    (_perf_runs([450, 460, 1500], [1000, 1000, 1000]), "the runs read inconclusive"),  # too noisy to bound
    (_perf_runs([450, 460], [1000, 1000]), None),  # the gate stops after min_pairs 2 when they decide
    (_perf_runs([450], [1000]), "expected 2 to 3 passing runs"),
    (_perf_runs([450, 460, 440], [1000, 1000, 1000], status="fail"), "expected 2 to 3 passing runs"),
])
def test_derive_performance_with_the_pins_bounds(evidence: dict[str, Any], why: str | None) -> None:
    spec = pins_mod.Performance(min_ratio=0.25, repeats=3, max_spread=3.0, reason="measured")
    got = trust.derive(GateResult(name="performance", status="pass", reason="", evidence=Evidence.model_validate(evidence)), 2,
                       spec)
    assert (got is None) if why is None else (got is not None and why in got), got
    unbounded = trust.derive(GateResult(name="performance", status="pass", reason=""), 2)
    assert unbounded is not None and "no acceptance.performance" in unbounded


def test_signature_hook_requires_a_valid_passed_result(tmp_path: Path) -> None:
    _, path = accepted_report(tmp_path)
    rep, where = _load(path), str(path)
    trust.check_signature(rep, where, None, None, None)  # signing not set up for this run

    def verify_ok(envelope: dict[str, Any], key: Any, digest: str) -> dict[str, Any]:
        assert digest == rep.image_id
        return {"result": "PASSED"}

    def verify_bad(envelope: dict[str, Any], key: Any, digest: str) -> dict[str, Any]:
        raise ValueError("signature: bad signature")

    trust.check_signature(rep, where, {"payload": "x"}, "key", verify_ok)
    with pytest.raises(BadInput, match="test result signature: signature: bad signature"):
        trust.check_signature(rep, where, {"payload": "x"}, "key", verify_bad)
    with pytest.raises(BadInput, match="signed result is 'FAILED'"):
        trust.check_signature(rep, where, {}, "key", lambda e, k, d: {"result": "FAILED"})
    with pytest.raises(BadInput, match="signed test result, its verifier or the public key is missing"):
        trust.check_signature(rep, where, None, "key", verify_ok)


def _shared_pins(folder: Path) -> Path:
    data = dict(DEMO, shared=["distribution"])
    data["components"] = {k: dict(v) for k, v in DEMO["components"].items()}
    data["components"]["verl"]["distribution"] = data["components"]["vllm"]["distribution"]
    (folder / "locks").mkdir()
    (folder / "locks" / "demo.lock").write_bytes(LOCK)
    (folder / "p.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "p.yaml"


def test_shared_components_need_the_setting_and_the_report_shows_it(tmp_path: Path, report_inputs: MakeReportInputs) -> None:
    pins = pins_mod.load(_shared_pins(tmp_path))
    assert pins.shared == ["distribution"]
    _, sources, build, acceptance = report_inputs()
    sources = sources.model_copy(update={"pins_path": str(pins.path), "pins_sha256": pins.sha256})
    rep = report.make_report(pins, lock_record.of(pins), sources, build, acceptance)
    assert rep.run_manifest.layers()["run"]["components_shared"] == ["distribution"]
    assert "components_shared" in report.to_markdown(rep)


@pytest.mark.parametrize("ref,part", [
    ("r.io/x..y", "path component 'x..y'"), ("r-.io/x", "label 'r-'"), ("r.io:99999/x", "port '99999'"),
    ("r.io/" + "a" * 251, "256 characters"), ("r.io/x:-t", "tag '-t'"), ("r.io/x@sha256:ab", "digest"),
])
def test_reference_names_the_broken_part(ref: str, part: str) -> None:
    with pytest.raises(ValueError, match=part.replace("(", r"\(").replace(".", r"\.")):
        reference.parse(ref)


def test_reference_parts() -> None:
    ref = reference.parse("[::1]:5000/a/b__c:v1@sha256:" + "0" * 64)
    assert (ref.domain, ref.path, ref.tag) == ("[::1]:5000", "a/b__c", "v1")
    assert reference.parse("debian").name == "debian" and reference.parse("localhost/x").domain == "localhost"


@pytest.mark.parametrize("word,read_as", [
    ("--find=x", "--find-links"), ("--prefi=/p", "--prefix"), ("--constr=c", "--constraint"),
    ("--trusted=h", "--trusted-host"), ("-cfoo", "-c foo"), ("-ihttp", "-i http"), ("-qrfoo", "-r foo"),
])
def test_pip_words_are_read_as_pip_reads_them(word: str, read_as: str) -> None:
    with pytest.raises(ValueError, match=f"pip reads it as '{read_as}'"):
        allowlist.check_pip_arg(word)


def test_pip_allowed_words_pass_in_full_only() -> None:
    for word in ("--no-deps", "-qq", "--only-binary=:all:", "--progress-bar=off"):
        assert allowlist.check_pip_arg(word) == word
    with pytest.raises(ValueError, match="abbreviates --no-build-isolation"):
        allowlist.check_pip_arg("--no-build-i")


def test_mounts_of_the_engines_data_root_are_refused_at_acceptance(tmp_path: Path) -> None:
    data = dict(DEMO)
    data["acceptance"] = dict(DEMO["acceptance"], mounts=[{"source": "/srv/engine/volumes/x", "target": "/data"}])
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "demo.lock").write_bytes(LOCK)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    pins = pins_mod.load(tmp_path / "p.yaml")  # /srv/engine is no default data root: the pins accept it
    pins_mod.check_mounts(pins, "/var/lib/docker")
    pins_mod.check_mounts(pins, None)
    for root in ("/srv/engine", "/srv/engine/volumes/x/y", "/srv/engine/./volumes/../"):
        with pytest.raises(BadInput, match=r"acceptance.mounts\[0\].source: .* exposes the engine's data root"):
            pins_mod.check_mounts(pins, root)


def test_template_lint_stays_a_second_wall(tmp_path: Path) -> None:
    from builder.image import render
    from builder.lock import record as lock_record

    pins = pins_mod.load(accepted_report(tmp_path)[0]["sources"]["pins_path"])
    vllm = pins.components.vllm
    bad = vllm.model_copy(update={"install": vllm.install.model_copy(update={"env": {"X": "http://evil/x"}})})
    forged = pins.model_copy(update={"components": pins.components.model_copy(update={"vllm": bad})})
    with pytest.raises(BadInput, match="no network access in the build"):  # what pins validation refuses first
        render.render_dockerfile(forged, lock_record.of(forged), None)
