"""benchmarks/real_vllm.py talks to pip's configured index only (pip index versions, pip download): no registry
host, no HTTP client of its own; `make real-repos` takes VLLM_VERSION."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import real_vllm  # noqa: E402


def test_no_registry_host_and_no_http_client_of_its_own() -> None:
    for name in ("real_vllm.py", "real_repos.py"):  # git remotes are fine; no package registry
        assert not re.search(r"pypi\.org|pythonhosted|PyPI", (ROOT / "benchmarks" / name).read_text()), name
    assert not re.search(r"https?://|urllib|requests\b", (ROOT / "benchmarks" / "real_vllm.py").read_text())
    assert '"index", "versions", "vllm"' in (ROOT / "benchmarks" / "real_vllm.py").read_text()


def test_newest_version_reads_pip_index_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    out = "vllm (0.11.0)\nAvailable versions: 0.11.0, 0.10.2\n"
    seen: list[tuple[str, ...]] = []

    def fake(python: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        seen.append(args)
        return subprocess.CompletedProcess([python, *args], 0, out, "")

    monkeypatch.setattr(real_vllm, "_pip", fake)
    assert real_vllm.newest_version() == "0.11.0" and seen == [("index", "versions", "vllm")]


def test_make_real_repos_takes_the_vllm_version() -> None:
    dry = subprocess.run(["make", "-n", "real-repos", "MIRRORS=/m", "VLLM_VERSION=0.11.0"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "benchmarks/real_repos.py --mirrors /m --vllm-version 0.11.0" in dry
