"""The real-vLLM trip-ups (issue 28 items 1, 2, 3, 4, 7, 8, 14): each bad input gets one line, its exit code
and nothing left behind (docs/lock.md, "Real-vLLM trip-ups")."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builder.core import files as fs
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.engine import basecontainer
from builder.engine.basecontainer import BaseInfo
from builder.lock import lockfile, native, resolver, wheels
from builder.sources import cmakefetch
from demo.make_stack import make_stack

NO_TORCH = BaseInfo(image="debian-rootfs@sha256:" + "0" * 64, python="3.11", abi="cp311", machine="x86_64",
                    glibc=(2, 36), dists={"pip": "24.0", "setuptools": "84.2.1"})


def pins_with(base_torch: str | None) -> Any:
    comps = {n: SimpleNamespace(base_torch=n == base_torch) for n in ("megatron", "vllm", "verl")}
    return SimpleNamespace(components=comps, base=SimpleNamespace(image=NO_TORCH.image, python_bin="/usr/bin/python3"))


# ---------------------------------------------------------------- item 1


def test_base_torch_on_a_base_without_torch_is_bad_input_before_anything_runs() -> None:
    with pytest.raises(BadInput) as err:  # gather checks first: no mirror, metadata container or download is touched
        lockfile.gather(None, pins_with("vllm"), None, NO_TORCH, None, "uv")  # type: ignore[arg-type]
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert str(err.value).startswith("components.vllm.base_torch: true, but the base has no torch (/usr/bin/python3 in")
    lockfile.check_base_torch(pins_with(None), NO_TORCH)  # no base_torch: nothing to say
    lockfile.check_base_torch(pins_with("vllm"), dataclasses.replace(NO_TORCH, dists={"Torch": "2.13.0"}))


CUT_ARGV = """Traceback (most recent call last):
  File "<string>", line 48, in <module>
  File "<string>", line 24, in build_requirements
subprocess.CalledProcessError: Command '['/usr/bin/python3', '-m', 'pip', 'install', '-q', '--no-index', \
'/tmp/lock/wheels/sympy-1.14.0-py3-none-any.whl']' returned non-zero exit status 1.
"""
NO_PIP = "/usr/bin/python3: No module named pip\n" + CUT_ARGV
SETUP_PY = """  error: subprocess-exited-with-error

  \u00d7 python setup.py egg_info did not run successfully.
  \u2502 exit code: 1
  \u2570\u2500> [6 lines of output]
      Traceback (most recent call last):
        File "<string>", line 2, in <module>
      AssertionError: CUDA_HOME is not set
      [end of output]

  note: This error originates from a subprocess, and is likely not a problem with pip.
error: metadata-generation-failed
"""
BOXED = SETUP_PY.replace("AssertionError: CUDA_HOME is not set", "planted: tinycore cannot be built")


@pytest.mark.parametrize(("output", "line"), [
    (NO_PIP, "/usr/bin/python3: No module named pip"),
    (SETUP_PY, "AssertionError: CUDA_HOME is not set"),
    (BOXED, "planted: tinycore cannot be built"),
    ("just a last line\n", "just a last line"),
])
def test_a_failed_base_container_names_the_cause_not_a_cut_argv(output: str, line: str) -> None:
    assert basecontainer.cause(output) == line
    result = basecontainer.Result(1, "", output, log="/cache/logs/run-1/lock-metadata-vllm.log")
    assert result.cause() == f"{line}; log /cache/logs/run-1/lock-metadata-vllm.log"


# ---------------------------------------------------------------- items 2, 3 and 14: the wheelhouse, offline


def make_wheel(directory: Path, name: str, version: str) -> Path:
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        info = f"{name}-{version}.dist-info"
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


def local_index(root: Path, wheel: Path) -> str:
    """A simple index on disk (pip reads <index>/<project>/index.html) serving one wheel."""
    name = wheel.name.split("-")[0]
    project = root / "simple" / name
    project.mkdir(parents=True)
    shutil.copy(wheel, project / wheel.name)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (project / "index.html").write_text(f'<html><body><a href="{wheel.name}#sha256={sha}">{wheel.name}</a></body></html>\n')
    return (root / "simple").as_uri() + "/"


def planted_host(tmp_path: Path) -> dict[str, str]:
    """A host whose pip configuration would change what is resolved: a constraint that forbids the locked
    version, an extra find-links folder, an extra index; plus a transport setting (timeout) that must stay."""
    (tmp_path / "constraints.txt").write_text("tinywheel==2.0\n")
    conf = tmp_path / "xdg" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"[global]\nconstraint = {tmp_path / 'constraints.txt'}\nfind-links = {tmp_path / 'links'}\n"
                    "extra-index-url = file:///nonexistent/simple\ntimeout = 17\n")
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
            "XDG_CONFIG_DIRS": str(tmp_path / "no-etc-xdg"), "BUILDER_CACHE": str(tmp_path / "cache"),
            "PIP_CONSTRAINT": str(tmp_path / "constraints.txt"), "PIP_FIND_LINKS": str(tmp_path / "links"),
            "PIP_EXTRA_INDEX_URL": "file:///nonexistent/simple", "PIP_DEFAULT_TIMEOUT": "19",
            "BUILDER_RUN_ID": "tripups-1"}


@pytest.mark.slow  # three pip processes
def test_the_hosts_pip_configuration_never_reaches_the_locks_pip(tmp_path: Path) -> None:
    host = planted_host(tmp_path)
    env = dict(Settings.from_env(host).resolver_env)
    assert env["PIP_CONFIG_FILE"] == os.devnull and env["UV_NO_CONFIG"] == "1"
    assert not {"PIP_CONSTRAINT", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"} & set(env)
    assert env["PIP_TIMEOUT"] == "17" and env["PIP_DEFAULT_TIMEOUT"] == "19"  # transport settings stay
    shown = subprocess.run([sys.executable, "-m", "pip", "config", "list"], env=env, capture_output=True, text=True,
                           check=True).stdout
    assert "constraint" not in shown and "find-links" not in shown and "extra-index" not in shown, shown
    seen = subprocess.run([sys.executable, "-m", "pip", "config", "list"], env=host, capture_output=True, text=True,
                          check=True).stdout
    assert "constraint" in seen and "find-links" in seen  # the plant is what pip would read without isolation
    wheel = make_wheel(tmp_path, "tinywheel", "1.0")  # ... and it refuses what the lock's pip fetches (next test)
    leaked = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "leak"),
                             "--index-url", local_index(tmp_path / "index", wheel), "tinywheel==1.0"], env=host,
                            capture_output=True, text=True)
    assert leaked.returncode != 0 and "tinywheel" in leaked.stdout + leaked.stderr


def test_wheel_fetch_uses_the_configured_index_only_and_a_run_unique_log(tmp_path: Path) -> None:
    host = planted_host(tmp_path)
    wheel = make_wheel(tmp_path, "tinywheel", "1.0")
    settings = dataclasses.replace(Settings.from_env(host), index_url=local_index(tmp_path / "index", wheel))
    lock = tmp_path / "build.lock"
    lock.write_text(f"tinywheel==1.0 --hash=sha256:{fs.sha256_file(wheel)}  # {wheel.name}\n")
    target = wheels.Target.from_base("3.11", "linux/amd64")
    # the planted constraint (==2.0) would refuse it
    house = wheels.ensure_wheels(lock, lock.read_text(), lock.read_bytes(), target, settings)
    assert sorted(p.name for p in house.iterdir()) == [wheel.name]
    log = settings.run_log("pip-download-lock")
    assert log == tmp_path / "cache" / "logs" / "tripups-1" / "pip-download-lock.log" and log.is_file()
    assert f"--index-url {settings.index_url}" in log.read_text()
    other = dataclasses.replace(settings, run_id="tripups-2")
    assert other.run_log("pip-download-lock") != log  # concurrent runs never share a log


def test_a_wheel_built_from_an_sdist_missing_from_the_wheelhouse_is_bad_input(tmp_path: Path) -> None:
    host = planted_host(tmp_path)
    wheel = make_wheel(tmp_path, "tinywheel", "1.0")
    settings = dataclasses.replace(Settings.from_env(host), index_url=local_index(tmp_path / "index", wheel))
    lock = tmp_path / "build.lock"
    lock.write_text(f"antlr4-python3-runtime==4.9.3 --hash=sha256:{'a' * 64}  # antlr4_python3_runtime-4.9.3-py3-none-"
                    f"any.whl {wheels.BUILT_MARK} sha256 {'b' * 64}\n"
                    f"tinywheel==1.0 --hash=sha256:{fs.sha256_file(wheel)}  # {wheel.name}\n")
    target = wheels.Target.from_base("3.11", "linux/amd64")
    with pytest.raises(BadInput) as err:
        wheels.ensure_wheels(lock, lock.read_text(), lock.read_bytes(), target, settings)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{lock}: antlr4-python3-runtime==4.9.3 (antlr4_python3_runtime-4.9.3-py3-none-"
                                     "any.whl) was built from an sdist by `builder lock`, no index serves it")
    assert "`builder lock --build-sdists`" in str(err.value)
    house = wheels.wheelhouse(lock.read_bytes(), target, settings)
    assert err.value.details[0] == f"wheelhouse: {house}"
    assert list(house.iterdir()) == [] and not [p for p in house.parent.iterdir() if p.name.endswith(fs.PART)]


def test_a_wheel_the_index_does_not_have_is_bad_input_naming_it(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "tinywheel", "1.0")
    settings = dataclasses.replace(Settings.from_env(planted_host(tmp_path)),
                                   index_url=local_index(tmp_path / "index", wheel))
    lock = tmp_path / "build.lock"
    lock.write_text(f"tinywheel==1.0 --hash=sha256:{fs.sha256_file(wheel)}\nnosuchwheel==3.0 --hash=sha256:{'c' * 64}\n")
    target = wheels.Target.from_base("3.11", "linux/amd64")
    with pytest.raises(BadInput, match=r"nosuchwheel==3.0 is not in the wheelhouse .* and the index file://.* has no"
                                       r" wheel of it for cp311 x86_64; run `builder lock`"):
        wheels.ensure_wheels(lock, lock.read_text(), lock.read_bytes(), target, settings)
    house = wheels.wheelhouse(lock.read_bytes(), target, settings)
    assert list(house.iterdir()) == [] and not [p for p in house.parent.iterdir() if p.name.endswith(fs.PART)]


def test_every_log_of_a_run_has_its_run_id_in_its_path() -> None:
    root = Path(__file__).resolve().parents[2] / "builder"
    shared = [f"{p.relative_to(root)}:{n}" for p in sorted(root.rglob("*.py"))
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if 'cache("logs") /' in line and not any(d in line for d in ("dockerd.log", "registry.log", ".lock"))]
    assert shared == []  # daemon logs (dockerd, registry) belong to the daemon, lock files are no logs


# ---------------------------------------------------------------- item 4


def test_a_missing_native_commit_names_the_url_and_the_mirror_it_was_fetched_from(tmp_path: Path,
                                                                                   settings: Settings) -> None:
    stack = make_stack(tmp_path / "stack")
    assert stack
    short = Path(tempfile.mkdtemp(prefix="i28-", dir="/tmp"))  # the whole line fits in 300 characters
    shutil.copytree(tmp_path / "stack" / "tinykernels.git", short / "kernels.git")
    config = tmp_path / "gitconfig"
    mirror = f"file://{short}/kernels.git"
    config.write_text(f'[url "{mirror}"]\n\tinsteadOf = https://kernels.example.invalid/tinykernels.git\n')
    rewritten = dataclasses.replace(settings, git_config=config, cache_root=tmp_path / "cache")
    missing = "0123" + "4" * 36
    declared = cmakefetch.Declaration("tinykernels", "https://kernels.example.invalid/tinykernels.git", missing,
                                      file="cmake/kernels.cmake:18")
    try:
        with pytest.raises(BadInput) as err:
            native.resolve_input(rewritten, "vllm", str(tmp_path / "stack" / "tinyengine.git"), declared)
    finally:
        shutil.rmtree(short)
    assert str(err.value) == (f"components.vllm: native input tinykernels (cmake/kernels.cmake:18): commit {missing}"
                              " not found in https://kernels.example.invalid/tinykernels.git (fetched from"
                              f" {mirror}, url.insteadOf in BUILDER_GIT_CONFIG)")
    assert err.value.exit_code == 2


def test_builder_find_links_is_the_one_way_to_add_a_wheel_folder(tmp_path: Path) -> None:
    """A wheel only in a folder: the host's pip config naming it does nothing, BUILDER_FIND_LINKS does (and the
    lock header states it); a folder that is not there is refused in one line."""
    links = tmp_path / "links"
    links.mkdir()
    wheel = make_wheel(tmp_path, "tinywheel", "1.0")
    shutil.copy(wheel, links / wheel.name)
    (tmp_path / "other").mkdir()
    empty = local_index(tmp_path / "index", make_wheel(tmp_path / "other", "otherwheel", "1.0"))
    lock = tmp_path / "build.lock"
    lock.write_text(f"tinywheel==1.0 --hash=sha256:{fs.sha256_file(wheel)}\n")
    target = wheels.Target.from_base("3.11", "linux/amd64")
    host = planted_host(tmp_path)  # its pip config and PIP_FIND_LINKS name the same folder
    plain = dataclasses.replace(Settings.from_env(host), index_url=empty)
    with pytest.raises(BadInput, match="tinywheel==1.0 is not in the wheelhouse"):
        wheels.ensure_wheels(lock, lock.read_text(), lock.read_bytes(), target, plain)
    settings = dataclasses.replace(Settings.from_env({**host, "BUILDER_FIND_LINKS": str(links)}), index_url=empty)
    assert settings.find_links == (str(links),)
    assert settings.index_args() == ["--index-url", empty, "--find-links", str(links)]
    house = wheels.ensure_wheels(lock, lock.read_text(), lock.read_bytes(), target, settings)
    assert sorted(p.name for p in house.iterdir()) == [wheel.name]
    assert resolver.shown_links(settings.find_links) == f", find-links: {links}"
    with pytest.raises(BadInput, match=r"^BUILDER_FIND_LINKS: expected folders or URLs, '/nonexistent/w' is not a"):
        Settings.from_env({**host, "BUILDER_FIND_LINKS": "/nonexistent/w"})
