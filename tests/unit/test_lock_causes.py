"""Lock and metadata failures by cause (issue 34, item 10), on planted pip and uv output: a pins/base mismatch
found while reading metadata is bad input (2) naming both sides, an index not reached or a full disk is
infrastructure (3), anything else failed the build (1); an answer of "no solution" stays bad input."""
from pathlib import Path
from typing import Any

import pytest

from builder.core.errors import BadInput, BuildFailed, InfraError
from builder.core.options import Settings
from builder.engine import basecontainer
from builder.engine.basecontainer import Result
from builder.lock import lockfile, resolver
from builder.lock.lockfile import ComponentInputs
from builder.lock.resolver import Target
from builder.pins import model as pins_mod

ROOT = Path(__file__).resolve().parents[2]
# pip 23.0 in the demo base preparing the metadata of Megatron-LM PR #6772's head (Requires-Python >=3.12)
PIP_REQUIRES_PYTHON = """Processing /tmp/lock/src
  Preparing metadata (pyproject.toml): started
  Preparing metadata (pyproject.toml): finished with status 'done'
ERROR: Package 'megatron-core' requires a different Python: 3.11.2 not in '>=3.12'
"""
PIP_CRASH = """Processing /tmp/lock/src
  Preparing metadata (setup.py): started
  error: subprocess-exited-with-error
  RuntimeError: planted: cannot prepare its metadata
  [end of output]
error: metadata-generation-failed
"""
PIP_DISK = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"
# uv 0.9 and pip 25 against an index that does not answer (captured, port 9 closed)
UV_UNREACHABLE = """error: Failed to fetch: `http://127.0.0.1:9/simple/six/`
  Caused by: error sending request for url (http://127.0.0.1:9/simple/six/)
  Caused by: client error (Connect)
  Caused by: tcp connect error
  Caused by: Connection refused (os error 111)
"""
PIP_UNREACHABLE = """Looking in indexes: http://127.0.0.1:9/simple
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by \
'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection object at 0x7f03>: Failed to establish a new \
connection: [Errno 111] Connection refused')': /simple/six/
ERROR: Could not find a version that satisfies the requirement six (from versions: none)
ERROR: No matching distribution found for six
"""
PIP_NO_SUCH_FILE = """Looking in indexes: http://127.0.0.1:8080/simple
ERROR: Could not find a version that satisfies the requirement oldpkg==0.1 (from versions: none)
ERROR: No matching distribution found for oldpkg==0.1
"""
UV_NO_SOLUTION = """error: No solution found when resolving dependencies
  cause: Because only megatron-core<=0.9 is available and you require megatron-core>0.9, we can conclude that \
your requirements are unsatisfiable.
"""
TARGET = Target(python="3.11", abi="cp311", machine="x86_64", glibc=(2, 36))


def _result(stderr: str, rc: int = 1) -> Result:
    return Result(rc, "", stderr, log="/cache/logs/r1/lock-metadata-megatron.log")


def test_a_requires_python_refusal_is_bad_input_naming_both_sides() -> None:
    err = basecontainer.failure(_result(PIP_REQUIRES_PYTHON), "components.megatron", "preparing metadata", "3.11")
    assert isinstance(err, BadInput) and err.exit_code == 2
    assert str(err) == ("components.megatron: megatron-core requires Python >=3.12 (its Requires-Python), but the base"
                        " has Python 3.11.2 (base.python: 3.11); pin a base whose Python meets it, or a megatron-core"
                        " that supports Python 3.11; log /cache/logs/r1/lock-metadata-megatron.log")


def test_a_crash_while_preparing_metadata_is_a_failed_build() -> None:
    err = basecontainer.failure(_result(PIP_CRASH), "components.vllm", "preparing metadata", "3.11")
    assert isinstance(err, BuildFailed) and err.exit_code == 1
    assert str(err).startswith("components.vllm: preparing metadata failed in the base (exit 1): RuntimeError: "
                               "planted: cannot prepare its metadata; log ")


def test_a_full_disk_in_the_base_is_infrastructure() -> None:
    err = basecontainer.failure(_result(PIP_DISK), "oldpkg-0.1.tar.gz", "building a wheel", "3.11")
    assert isinstance(err, InfraError) and err.exit_code == 3
    assert str(err).startswith("oldpkg-0.1.tar.gz: building a wheel in the base: disk: No space left on device")


def test_preparing_metadata_raises_the_mismatch_as_bad_input(monkeypatch: pytest.MonkeyPatch, settings: Settings,
                                                             tmp_path: Path) -> None:
    pins = pins_mod.load(ROOT / "pins" / "demo.yaml")
    (tmp_path / "src.tar").write_bytes(b"")
    monkeypatch.setattr(lockfile, "exported_tar", lambda settings, component: tmp_path / "src.tar")
    monkeypatch.setattr(basecontainer, "run", lambda *args, **kw: _result(PIP_REQUIRES_PYTHON))
    inputs = ComponentInputs(name="megatron", distribution="megatron-core")
    with pytest.raises(BadInput) as err:
        lockfile.prepare_metadata(settings, pins, None, inputs, [])  # type: ignore[arg-type]
    assert str(err.value).startswith("components.megatron: megatron-core requires Python >=3.12 (its "
                                     "Requires-Python), but the base has Python 3.11.2 (base.python: 3.11)")


@pytest.mark.parametrize("output, cause", [(UV_UNREACHABLE, "Connection refused (os error 111)"),
                                           (PIP_UNREACHABLE, "Failed to establish a new connection")])
def test_an_index_not_reached_is_named_as_such(output: str, cause: str) -> None:
    assert cause in resolver.unreachable(output)


@pytest.mark.parametrize("output", [PIP_NO_SUCH_FILE, UV_NO_SOLUTION, PIP_REQUIRES_PYTHON, ""])
def test_an_index_that_answered_is_not_unreachable(output: str) -> None:
    assert resolver.unreachable(output) == ""


@pytest.mark.parametrize("resolve, output, error", [
    (resolver._uv, UV_UNREACHABLE, InfraError), (resolver._uv, UV_NO_SOLUTION, BadInput),
    (resolver._pip, PIP_UNREACHABLE, InfraError), (resolver._pip, PIP_NO_SUCH_FILE, BadInput),
])
def test_a_failed_resolution_by_its_cause(monkeypatch: pytest.MonkeyPatch, settings: Settings, tmp_path: Path,
                                          resolve: Any, output: str, error: type) -> None:
    monkeypatch.setattr(resolver, "_run", lambda settings, argv, log_name: (1, output))
    monkeypatch.setattr(resolver, "uv_bin", lambda: "uv")
    with pytest.raises(error) as err:
        resolve(settings, tmp_path, TARGET, "lock-resolve-runtime")
    if error is InfraError:
        assert " was not reached: " in str(err.value) and "lock-resolve-runtime.log" in str(err.value)
    else:
        assert "was not reached" not in str(err.value)


@pytest.mark.parametrize("output, error", [(PIP_UNREACHABLE, InfraError), (PIP_NO_SUCH_FILE, BadInput)])
def test_an_sdist_download_by_its_cause(monkeypatch: pytest.MonkeyPatch, settings: Settings, output: str,
                                        error: type) -> None:
    monkeypatch.setattr(resolver, "_run", lambda settings, argv, log_name: (1, output))
    with pytest.raises(error) as err:
        resolver.download_sdist(settings, "oldpkg", "0.1")
    assert str(err.value).startswith("oldpkg==0.1: the index" if error is BadInput else "pip download: the index")
