"""The CLI composes the stages: exit codes and one-line errors, end to end through subprocesses."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from demo.make_stack import make_stack

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_stack_ready() -> None:
    make_stack(ROOT / "pins" / "demo-stack")


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_resolve_demo_prints_record(demo_stack_ready: None) -> None:
    out = cli("resolve", "pins/demo.yaml")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert set(record["components"]) == {"vllm", "megatron", "verl"}
    vllm = record["components"]["vllm"]
    assert (vllm["pr"], vllm["ahead"], vllm["behind"]) == (11, 3, 1)  # kernels, switch, CUDA
    assert "merge-base" in out.stderr  # the readable table


def test_bad_pins_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = (ROOT / "pins" / "demo.yaml").read_text().replace("pr: 11", "pr: eleven")
    bad.write_text(text)
    out = cli("resolve", str(bad))
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "components.vllm.pr" in errors[0] and str(bad) in errors[0]
    assert out.stdout == ""


def test_missing_local_repository_exits_2_and_absolute_path_urls_work(demo_stack_ready: None, tmp_path: Path) -> None:
    stack = ROOT / "pins" / "demo-stack"
    text = (ROOT / "pins" / "demo.yaml").read_text()
    shutil.copytree(ROOT / "pins" / "locks", tmp_path / "locks")
    good = tmp_path / "abs.yaml"
    good.write_text(text.replace("url: demo-stack/", f"url: {stack}/"))  # plain absolute paths, as git takes them
    out = cli("resolve", str(good))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["components"]["verl"]["url"] == f"{stack}/tinyrl.git"
    for url in (f"{tmp_path}/gone.git", f"file://{tmp_path}/gone.git"):
        bad = tmp_path / "missing.yaml"
        bad.write_text(text.replace("url: demo-stack/tinyengine.git", f"url: {url}"))
        out = cli("resolve", str(bad))
        assert out.returncode == 2, out.stderr
        assert f"{url}: no such local repository {tmp_path}/gone.git" in out.stderr


def test_missing_pins_file_exit_2(tmp_path: Path) -> None:
    out = cli("build", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2
    assert "nope.yaml" in out.stderr


def test_bad_report_format_exit_2(tmp_path: Path) -> None:
    out = cli("report", str(tmp_path / "report.json"), "--format", "pdf")
    assert out.returncode == 2


def test_nemotron_pins_validate_and_render_from_pins_alone(tmp_path: Path) -> None:
    first = cli("render", "--pins-only", "pins/nemotron-3.5-lightning.yaml")
    assert first.returncode == 0, first.stderr
    again = cli("render", "--pins-only", str(ROOT / "pins" / "nemotron-3.5-lightning.yaml"), cwd=tmp_path)
    assert again.stdout == first.stdout  # byte-identical, whatever the cwd
    text = first.stdout
    assert text.count("FROM nvcr.io/nvidia/pytorch:26.07-py3@sha256:2140e699b3beaf7f96a0081fd9c9406bc3832b435cdb60"
                      "dfa2d261f7d2f34a1c AS ") == 2
    assert '"io.truepolicy.vllm.commit"="4b5c627c23e6690b8987100d1cbf78e34ac14bf9"' in text
    assert '"io.truepolicy.megatron.pr"="7050"' in text and '"io.truepolicy.verl.pr"="7688"' in text
    assert '"TORCH_CUDA_ARCH_LIST=' in text and '"megatron-core"' in text
    assert "git clone" not in text and "http" not in text.split("LABEL")[0]


def test_version_prints_the_tool_and_its_version() -> None:
    from builder import __version__

    out = cli("--version")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"rl-image-builder {__version__}\n", "")


def test_a_report_that_is_not_json_names_the_file_not_an_empty_location(tmp_path: Path) -> None:
    bad = tmp_path / "report.json"
    bad.write_text("{not json")
    out = cli("report", str(bad), "--format", "md")
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert line.startswith(f"error: {bad}: not a report: Invalid JSON") and ": : " not in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
