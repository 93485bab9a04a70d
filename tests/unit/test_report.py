"""Report: verdict logic, unknown layers, Markdown PR table, JUnit XML, files round trip."""
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import BadInput
from builder.core.records import Evidence, GateResult, GateStatus, Report
from builder.image.render import sha_tag
from builder.lock import record as lock_record
from builder.report import document as report
from tests.fixture_types import MakeReportInputs


def make(report_inputs: MakeReportInputs, manifest: dict[str, Any] | None = None, **kwargs: Any) -> Report:
    pins, sources, build, acceptance = report_inputs(**kwargs)
    return report.make_report(pins, lock_record.of(pins), sources, build, acceptance, image_manifest=manifest)


def status_of(rep: Report, name: str) -> GateStatus:
    return {g.name: g.status for g in rep.gates}[name]


def test_all_required_gates_pass_is_accepted(report_inputs: MakeReportInputs) -> None:
    rep = make(report_inputs)
    assert rep.verdict == "ACCEPTED"
    assert rep.reasons == []
    assert [g.status for g in rep.gates] == ["pass"] * 5


def test_report_records_the_lock_sha256(report_inputs: MakeReportInputs) -> None:
    import hashlib
    from pathlib import Path

    pins, sources, build, acceptance = report_inputs()
    pins._path = Path(__file__).resolve().parents[2] / "pins" / "demo.yaml"  # lock relative to it
    rep = report.make_report(pins, lock_record.of(pins), sources, build, acceptance)
    want = hashlib.sha256(pins.lock_path().read_bytes()).hexdigest()
    assert rep.lock_sha256 == want and rep.run_manifest.layers()["run"]["lock_sha256"] == want
    assert f"| Lock sha256 | `{want}` |" in report.to_markdown(rep)


@pytest.mark.parametrize("status", ["fail", "inconclusive", None])
@pytest.mark.parametrize("gate", ["provenance", "zero_update", "rl_step", "control"])
def test_one_required_gate_not_passing_is_not_accepted(report_inputs: MakeReportInputs, gate: str, status: str | None) -> None:
    rep = make(report_inputs, statuses={gate: status})
    assert rep.verdict == "NOT ACCEPTED"
    expected = status or "not_run"
    assert status_of(rep, gate) == expected
    assert any(r.startswith(f"required gate {gate}: {expected.replace('_', ' ')}") for r in rep.reasons)


def test_no_acceptance_means_every_gate_not_run(report_inputs: MakeReportInputs) -> None:
    rep = make(report_inputs, acceptance=False)
    assert rep.verdict == "NOT ACCEPTED"
    assert {g.name: g.status for g in rep.gates} == dict.fromkeys(
        ["provenance", "zero_update", "rl_step", "control", "performance"], "not_run")
    assert "no acceptance result" in rep.reasons


def test_gate_not_required_does_not_block_but_shows(report_inputs: MakeReportInputs) -> None:
    rep = make(report_inputs, required=["provenance", "zero_update", "rl_step"], statuses={"control": "fail"})
    assert rep.verdict == "ACCEPTED"
    assert status_of(rep, "control") == "fail"
    assert "| control | no | fail |" in report.to_markdown(rep)


def test_empty_required_gates_is_not_accepted(report_inputs: MakeReportInputs) -> None:
    from builder.core.errors import BadInput

    with pytest.raises(BadInput, match="acceptance.required_gates"):  # the pins refuse it first
        report_inputs(required=[])
    pins, sources, build, acceptance = report_inputs()
    pins.acceptance.required_gates = []  # and the report does not trust the pins to have done so
    rep = report.make_report(pins, lock_record.of(pins), sources, build, acceptance)
    assert rep.verdict == "NOT ACCEPTED"
    assert any("nothing required" in r for r in rep.reasons)


def test_duplicate_gate_result_keeps_the_worst(report_inputs: MakeReportInputs) -> None:
    pins, sources, build, acceptance = report_inputs()
    assert acceptance is not None
    acceptance.gates.append(acceptance.gates[2].model_copy(update={"status": "fail", "reason": "second run"}))
    rep = report.make_report(pins, lock_record.of(pins), sources, build, acceptance)
    assert status_of(rep, "rl_step") == "fail"
    assert rep.verdict == "NOT ACCEPTED"


def test_acceptance_of_another_image_is_not_accepted(report_inputs: MakeReportInputs) -> None:
    rep = make(report_inputs, accepted_image="sha256:" + "99" * 32)
    assert rep.verdict == "NOT ACCEPTED"
    assert any("acceptance ran on sha256:9999" in r for r in rep.reasons)


def test_manifest_commit_other_than_pinned_is_not_accepted(report_inputs: MakeReportInputs) -> None:
    pins, *_ = report_inputs()
    manifest = {"components": {"verl": {"commit": "1" * 40, "version": "0.1.0"}}}
    rep = make(report_inputs, manifest=manifest)
    assert rep.verdict == "NOT ACCEPTED"
    assert any(r.startswith("image: verl commit 1111") for r in rep.reasons)
    good = {"components": {n: {"commit": pins.components[n].commit} for n in ("vllm", "megatron", "verl")}}
    assert make(report_inputs, manifest=good).verdict == "ACCEPTED"


def test_uncaptured_layers_read_unknown(report_inputs: MakeReportInputs) -> None:
    rep = make(report_inputs, acceptance=False, build=False)
    layers = rep.run_manifest.layers()
    assert list(layers) == ["source", "installed_packages", "native_libraries", "jit_caches", "container", "run",
                            "native_build"]
    assert layers["jit_caches"] == "unknown"
    assert layers["installed_packages"]["vllm"]["version"] == "unknown"
    assert layers["installed_packages"]["vllm"]["modules"] == {"tinyengine": "unknown"}
    assert layers["native_libraries"]["megatron"] == {"in_image": "unknown", "loaded": "unknown"}
    assert layers["container"]["image_id"] == "unknown"
    assert layers["container"]["registry_digest"] == "unknown"
    assert layers["container"]["build"] == "unknown"
    assert layers["run"]["container_env"] == "unknown"
    assert layers["run"]["model_weights_digest"] == "unknown"
    assert rep.image_id == "unknown"
    assert "unknown (no build record" in report.to_markdown(rep)


def test_captured_layers_come_from_manifest_and_evidence(report_inputs: MakeReportInputs) -> None:
    pins, *_ = report_inputs()
    manifest = {"python": "/opt/venv/bin/python", "site_packages": "/opt/venv/lib/python3.11/site-packages",
                "components": {"megatron": {"commit": pins.components["megatron"].commit, "version": "0.3.0",
                                            "files": {"/a.py": "00"}, "native_libs": {}}}}
    layers = make(report_inputs, manifest=manifest).run_manifest.layers()
    installed, native = layers["installed_packages"], layers["native_libraries"]
    assert installed["megatron"]["version"] == "0.3.0" and installed["megatron"]["files_in_manifest"] == 1
    assert installed["vllm"]["version"] == "0.2.0" and installed["vllm"]["files_in_manifest"] == 9  # provenance
    assert installed["vllm"]["modules"]["tinyengine"].endswith("site-packages/tinyengine/__init__.py")
    assert installed["verl"]["version"] == "unknown" and installed["verl"]["modules"] == {"tinyrl": "unknown"}
    assert native["megatron"]["in_image"] == "none listed in the image manifest"
    assert native["verl"] == {"in_image": "unknown", "loaded": "none loaded by the provenance check"}
    assert layers["jit_caches"]["env"] == {"TRITON_CACHE_DIR": "/cache/triton"}
    assert layers["jit_caches"]["caches_at_start"] == {"/cache/triton": []}
    assert layers["run"]["interpreter"] == "/opt/venv/bin/python"
    assert layers["source"]["vllm"]["commit_in_image"] == pins.components["vllm"].commit  # from the stamp
    assert layers["source"]["verl"]["commit_in_image"] == "unknown"


def test_provenance_not_run_leaves_its_items_unknown(report_inputs: MakeReportInputs) -> None:
    layers = make(report_inputs, statuses={"provenance": None}).run_manifest.layers()
    assert layers["installed_packages"]["vllm"]["version"] == "unknown"
    assert layers["native_libraries"]["vllm"]["loaded"] == "unknown"
    assert layers["run"]["python_version"] == "unknown"


def test_tags_are_sha_tag_then_human_tags_and_stable(report_inputs: MakeReportInputs) -> None:
    pins, *_ = report_inputs()
    rep1, rep2 = make(report_inputs), make(report_inputs)
    assert rep1.tags == rep2.tags == [sha_tag(pins), "demo"]
    assert rep1.tags[0] == ".".join(f"{n}-{pins.components[n].commit[:12]}" for n in ("vllm", "megatron", "verl"))


def test_markdown_has_one_image_block_a_seven_column_pr_table_and_readable_evidence(report_inputs: Any) -> None:
    pins, sources, *_ = report_inputs()
    rep = make(report_inputs, statuses={"rl_step": "fail"})
    md = report.to_markdown(rep)
    assert "\x1b" not in md
    lines = md.splitlines()
    assert "**NOT ACCEPTED**" in lines[0]
    image = lines.index("### Image")
    block = lines[image + 2:lines.index("", image + 2)]
    pairs = [[c.strip() for c in row.strip("|").split(" | ")] for row in block[2:]]
    assert {k: v for k, v in pairs} == {"Repository": f"`{rep.repository}`", "Image ID": f"`{rep.image_id}`",
                     "Registry digest": "not published", "Tags": f"`{sha_tag(pins)}`, `demo`",
                     "Platform": "linux/amd64", "Base image": f"`{rep.base_image}`",
                     "Base digest": "`sha256:" + "cd" * 32 + "`", "Lock sha256": f"`{rep.lock_sha256}`"}
    assert md.count(rep.image_id) == 1 + sum(rep.image_id in line for line in md.split("<details>")[1].splitlines())
    header = lines.index("| Component | Repository | PR | Target | Merge-base | Head | Ahead / behind |")
    assert lines[header + 1] == "|" + "---|" * 7
    for row, (name, comp) in zip(lines[header + 2:header + 5], sources.components.items(), strict=True):
        row_cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert row_cells == [name, comp.url, f"#{comp.pr}", comp.target, f"`{comp.merge_base}`", f"`{comp.commit}`",
                         "+2 / -1"]
    gates = {row.split(" | ")[0].strip("| "): row for row in lines if row.startswith("| ") and " | yes | " in row}
    assert gates["rl_step"].startswith("| rl_step | yes | fail | rl_step fail |")
    assert "diff_max max 0.0 over 2 steps; k3_kl max 0.0 over 2 steps; weights changed in 2 of 2 steps;" \
           " throughput 1234 |" in gates["rl_step"]
    assert "| zero_update | yes | pass |" in gates["zero_update"] and "1 distinct weight checksum(s)" in gates["zero_update"]
    assert "vllm 0.2.0 at " in gates["provenance"] and "0 failure(s)" in gates["provenance"]
    assert "ratio 1.029; min_ratio 0.25; aligned median 1234, spread 1" in gates["performance"]
    assert "..." not in "".join(gates.values()) and "full evidence is in report.json" in md
    assert "aligned 1234, control 1200, ratio 1.029." in md
    assert "| tinyengine | 0.2.0 | tinycore works only" in md


def test_readable_evidence_keeps_whole_items_and_says_what_is_left_out() -> None:
    evidence = {"components": {f"component{i}": {"version": "1.0", "stamp": {"commit": "ab" * 20}}
                               for i in range(20)}}
    text = report.readable_evidence(Evidence.model_validate(evidence), limit=120)
    assert len(text) <= 120 and text.endswith("more in report.json")
    assert all(part.startswith("component") and part.endswith(" at " + "ab" * 6)
               for part in text.split("; ")[:-1]), text


def test_junit_has_one_case_per_gate_with_right_elements(report_inputs: MakeReportInputs) -> None:
    rep = make(report_inputs, statuses={"zero_update": "fail", "rl_step": "inconclusive", "control": None})
    top = ET.fromstring(report.to_junit(rep))
    assert top.tag == "testsuites" and [s.get("name") for s in top] == ["acceptance"]  # no .sqsh: no placement suite
    root = top[0]
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("5", "1", "1", "1")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert list(cases) == ["provenance", "zero_update", "rl_step", "control", "performance"]
    assert cases["provenance"].find("failure") is None and cases["provenance"].find("skipped") is None
    def message(case: str, tag: str) -> str | None:
        found = cases[case].find(tag)
        assert found is not None, (case, tag)
        return found.get("message")

    assert message("zero_update", "failure") == "zero_update fail"
    assert message("rl_step", "error") == "rl_step inconclusive"
    assert message("control", "skipped") == "not in the acceptance result"
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["verdict"] == "NOT ACCEPTED"


def test_write_and_load_round_trip(report_inputs: MakeReportInputs, tmp_path: Path) -> None:
    rep = make(report_inputs)
    paths = report.write(rep, tmp_path / "run")
    assert {p.name for p in paths.values()} == {"report.json", "report.md", "junit.xml", "ctrf.json"}
    assert json.loads(paths["ctrf"].read_text())["results"]["summary"]["tests"] == len(rep.gates)
    assert report.load(paths["json"]) == rep
    assert paths["md"].read_text() == report.to_markdown(rep)
    ET.parse(paths["junit"])
    assert json.loads(paths["json"].read_text())["verdict"] == "ACCEPTED"


def test_load_refuses_a_non_report(tmp_path: Path) -> None:
    bad = tmp_path / "report.json"
    bad.write_text(json.dumps({"verdict": "ACCEPTED"}))
    with pytest.raises(BadInput, match="report.json: not a report"):
        report.load(bad)
    with pytest.raises(BadInput, match="cannot read"):
        report.load(tmp_path / "missing.json")


def test_native_build_inputs_and_knobs_are_listed(report_inputs: MakeReportInputs) -> None:
    rep = make(report_inputs)
    native = rep.run_manifest.layers()["native_build"]
    [item] = native["inputs"]
    assert (item["component"], item["name"], item["ref"], item["receive"]) == \
        ("vllm", "tinykernels", "v0.1.0", "TINYKERNELS_SRC_DIR")
    assert native["knobs"]["vllm"]["device"] == "cpu" and native["knobs"]["vllm"]["cmake"] is True
    md = report.to_markdown(rep)
    assert "### Native build inputs" in md and f"`{item['commit']}`" in md and "TINYENGINE" not in md.split("###")[0]
    assert "| vllm | cpu | - |" in md


def test_run_manifest_records_gpus_or_none(report_inputs: MakeReportInputs) -> None:
    from acceptance import gpu

    assert gpu.facts() == "none"  # this host's torch sees no GPU
    pins, sources, built, result = report_inputs()
    assert result is not None

    def with_gpu(value: Any) -> Any:  # records are frozen: a new provenance gate with (or without) its GPU facts
        def one(g: GateResult) -> GateResult:
            ev = {k: v for k, v in g.evidence.as_dict().items() if k != "gpu"}
            return g.model_copy(update={"evidence": Evidence.model_validate(ev if value is None else {**ev, "gpu": value})})
        return result.model_copy(update={"gates": [one(g) if g.name == "provenance" else g for g in result.gates]})

    rep = report.make_report(pins, lock_record.of(pins), sources, built, with_gpu("none"))
    assert rep.run_manifest.layers()["run"]["gpus"] == "none"
    facts = {"count": 1, "devices": [{"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"}],
             "driver": "580.159.04", "cuda_runtime": "13.0",
             "numerics": {"tf32_matmul": False, "deterministic_algorithms": False,
                          "env": {"CUBLAS_WORKSPACE_CONFIG": "unset"}}}
    rep = report.make_report(pins, lock_record.of(pins), sources, built, with_gpu(facts))
    assert rep.run_manifest.layers()["run"]["gpus"] == facts
    md = report.to_markdown(rep)
    assert "| run | gpus.devices[0].name | NVIDIA H200 |" in md and "| run | gpus.driver | 580.159.04 |" in md
    again = report.make_report(pins, lock_record.of(pins), sources, built, with_gpu(None))
    assert again.run_manifest.layers()["run"]["gpus"] == "unknown"


def test_gpu_driver_version_from_the_kernel_module_line() -> None:
    from acceptance.gpu import VERSION

    line = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)"
    for text, version in ((line, "580.159.04"),
                          ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19", "535.104.05")):
        found = VERSION.search(text)
        assert found is not None and found.group(1) == version
