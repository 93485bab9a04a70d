"""docs/ci/nightly.yml: actionlint when it is installed, else the GitHub workflow JSON schema
(vendored in check-jsonschema); a broken copy must fail the same check."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / "docs" / "ci" / "nightly.yml"


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    actionlint = shutil.which("actionlint")
    if actionlint:
        return subprocess.run([actionlint, str(path)], capture_output=True, text=True, timeout=120)
    pytest.importorskip("check_jsonschema", reason="needs check-jsonschema (the [test] extra)")
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(path)], capture_output=True, text=True, timeout=120)


def test_workflow_validates() -> None:
    done = lint(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


def test_workflow_runs_nightly_on_self_hosted_and_uploads_reports() -> None:
    wf = yaml.safe_load(WORKFLOW.read_text())
    job = wf["jobs"]["nightly"]
    assert "self-hosted" in job["runs-on"]
    runs = " ".join(step.get("run", "") for step in job["steps"])
    assert "builder nightly" in runs and "--follow-prs" in runs and "--publish" in runs
    upload = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    for name in ("junit.xml", "ctrf.json", "report.md", "nightly-diff.md", "nightly-diff.json"):
        assert name in upload["with"]["path"]


@pytest.mark.parametrize("old,new", [("    runs-on: [self-hosted, linux, x64, docker]\n", ""),
                                     ("    steps:\n", "    stepz:\n")], ids=["no runs-on", "unknown key"])
def test_broken_workflow_fails_the_check(tmp_path: Path, old: str, new: str) -> None:
    text = WORKFLOW.read_text()
    assert text.count(old) == 1
    broken = tmp_path / "nightly.yml"
    broken.write_text(text.replace(old, new))
    assert lint(broken).returncode != 0
