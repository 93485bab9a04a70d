"""Scripts that run inside the build: constraints keep the base's and earlier components' versions."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "builder" / "image" / "scripts"))
import install  # noqa: E402
import pytest  # noqa: E402
from common import same_version, site_dirs  # noqa: E402

# install.constraints reads its two inputs with open(...).read() and leaves closing to the garbage collector
# (a one-shot script inside the build); with warnings as errors that ResourceWarning would fail these tests.
# Scoped here, not fixed: this branch changes production code by annotations only (follow-up: use read_text).
CONSTRAINTS_LEAK = pytest.mark.filterwarnings("ignore:unclosed file:ResourceWarning")


def fake_install(prefix: Path, name: str, version: str) -> None:
    site = Path(site_dirs(str(prefix))[0])
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@CONSTRAINTS_LEAK
def test_constraints_pin_base_and_earlier_components(tmp_path: Path) -> None:
    (tmp_path / "names").write_text("torch\nvllm\nnot-installed\n")
    (tmp_path / "base").write_text("torch==2.13.0\n")
    fake_install(tmp_path / "vllm", "vllm", "0.11.1")
    dirs = site_dirs(str(tmp_path / "vllm"))
    out = install.constraints(dirs, str(tmp_path / "c.txt"), str(tmp_path / "names"), str(tmp_path / "base"))
    assert Path(out).read_text().splitlines() == ["torch==2.13.0", "vllm==0.11.1"]


@CONSTRAINTS_LEAK
def test_constraints_without_earlier_components_keep_only_base(tmp_path: Path) -> None:
    (tmp_path / "names").write_text("torch\nvllm\n")
    (tmp_path / "base").write_text("torch==2.13.0\n")
    out = install.constraints([], str(tmp_path / "c.txt"), str(tmp_path / "names"), str(tmp_path / "base"))
    assert Path(out).read_text().splitlines() == ["torch==2.13.0"]


def test_versions_compare_as_pep440() -> None:
    assert same_version("0.10.0.dev", "0.10.0.dev0")  # verl's __version__ against its metadata
    assert same_version("1.0", "1.0.0") and same_version("0.2.1.dev2+g0428cfe", "0.2.1.dev2+g0428cfe")
    assert not same_version("0.10.0.dev", "0.10.0")
    assert not same_version("not a version", "0.1") and same_version("custom-x", "custom-x")


def test_the_image_and_the_host_agree_on_a_version_built_from_vcs() -> None:
    """smoke.py (in the image) accepts what the host's check accepts: the VCS version, or it with an
    appended local label (vLLM's CPU build adds `.cpu`), nothing else."""
    from common import built_from_vcs

    from builder.sources import scmversion

    cases = [("0.31.1.dev1+g9792a6a.cpu", "0.31.1.dev1+g9792a6a", True), ("1.2.3+cpu", "1.2.3", True),
             ("1.2.3", "1.2.3", True), ("0.33.0", "0.33.1.dev1+g9752642941", False), ("1.2.30", "1.2.3", False),
             ("1.2.3.post1", "1.2.3", False), ("0.31.1.dev1+g9792a6ab", "0.31.1.dev1+g9792a6a", False)]
    for built, scm, ok in cases:
        assert built_from_vcs(built, scm) is ok and scmversion.same_version(built, scm) is ok, (built, scm)
