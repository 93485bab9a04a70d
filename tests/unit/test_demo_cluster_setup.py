"""`make demo-cluster` on a fresh machine (demo/cluster.py, issue 34 item 5): what the cluster needs is installed
with apt-get as `builder setup` installs Docker, with the same progress lines; what cannot be installed is one
`error:` line saying what to do, never a traceback; the cluster's files live under the builder's cache."""
import subprocess
import sys
from pathlib import Path
from typing import Any

from builder.core.options import Settings
from demo import cluster

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["charliecloud-runtime", "mariadb-server", "munge", "slurm-wlm", "slurmdbd"]
# apt-get on a fresh machine: `update`, then `install` puts the packages' programs on the PATH (here: stubs)
FAKE_APT = """#!/bin/sh
echo "$*" >> "$APT_CALLS"
[ "$1" = install ] || exit 0
for program in {programs}; do printf '#!/bin/sh\\nexit 0\\n' > "$BIN/$program"; /bin/chmod 755 "$BIN/$program"; done
echo "Setting up slurm-wlm ..."
"""


def _python(code: list[str], tmp_path: Path, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": path, "BUILDER_CACHE": str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1",
            "BUILDER_PROGRESS_EVERY": "1", "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, *code], cwd=ROOT, env={**base, **env}, capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_fresh_machine_gets_the_cluster_packages_from_apt(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT.format(programs=" ".join(cluster.PACKAGES)))
    (bin_dir / "apt-get").chmod(0o755)
    code = "from demo import cluster; from builder.core.options import Settings as S; " \
           "print(cluster.ensure_installed(S.from_env())); print(cluster.ensure_installed(S.from_env()))"
    run = _python(["-c", code], tmp_path, str(bin_dir), APT_CALLS=str(tmp_path / "calls"), BIN=str(bin_dir))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [str(PACKAGES), "[]"]  # the second time: nothing missing, nothing installed
    assert (tmp_path / "calls").read_text().splitlines() == [
        "update", "install -y --no-install-recommends " + " ".join(PACKAGES)]
    steps = [ln for ln in run.stderr.splitlines() if ln.startswith("<== ")]
    assert [s.rsplit(" (", 1)[0] for s in steps] == [f"<== apt-get install {' '.join(PACKAGES)}",
                                                      "<== setup: slurm cluster packages"], run.stderr
    assert not any("FAILED" in s for s in steps)
    assert list((tmp_path / "cache" / "logs").rglob("apt.log")), "apt's output goes to the run's log"


def test_a_missing_piece_that_cannot_be_installed_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    run = _python(["-m", "demo.cluster", "start"], tmp_path, str(tmp_path / "empty"))
    assert run.returncode == 3, run.stderr
    assert "Traceback" not in run.stderr
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: {' '.join(PACKAGES)}: missing and apt-get is not available to install them"], run.stderr
    assert not (tmp_path / "cache" / "cluster").exists()  # nothing configured, nothing started


def test_the_cluster_lives_under_the_builders_cache(tmp_path: Path) -> None:
    settings = Settings.from_env({"BUILDER_CACHE": str(tmp_path)})
    assert cluster.default_root(settings) == tmp_path / "cluster"
    assert Settings.from_env({}).cache_root == ROOT / ".cache"  # in a checkout: its .cache, as the README says


def test_the_cluster_mounts_fusectl_once_and_says_so_when_it_cannot(tmp_path: Path, monkeypatch: Any,
                                                                     capsys: Any) -> None:
    """fusectl, where a gate task aborts its own FUSE connection (builder/runners/slurm_runtimes.py): mounted once (not
    again when /proc/mounts lists it); a mount that fails is one line and the cluster still starts."""
    calls: list[list[str]] = []

    def mount(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 32, "", "mount: permission denied")

    monkeypatch.setattr(subprocess, "run", mount)
    mounts = tmp_path / "mounts"
    mounts.write_text("sysfs /sys sysfs rw 0 0\nfusectl /sys/fs/fuse/connections fusectl rw 0 0\n")
    cluster.mount_fusectl(mounts)
    assert calls == []
    mounts.write_text("sysfs /sys sysfs rw 0 0\n")
    cluster.mount_fusectl(mounts)
    assert calls == [["mount", "-t", "fusectl", "fusectl", "/sys/fs/fuse/connections"]]
    said = capsys.readouterr()
    assert "fusectl not mounted at /sys/fs/fuse/connections (mount: permission denied)" in said.out + said.err
