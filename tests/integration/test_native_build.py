"""The demo engine's CMake-built extension end to end (Docker): tinykernels supplied offline from the lock
and recorded in the manifest and report; an undeclared input fails the disconnected build naming it;
`builder lock --check` names a changed GIT_TAG."""
import json
from pathlib import Path

import pygit2
import pytest
import yaml

from builder.core.errors import BuildFailed, StaleLock
from builder.core.options import Settings
from builder.engine import client as engine
from builder.lock import native
from builder.lock import record as lock_record
from builder.pipeline import building
from builder.report import manifest as manifest_layers
from tests.fixture_types import DemoImage, DockerClient

pytestmark = pytest.mark.docker


def test_demo_image_carries_its_native_build(demo_image: DemoImage, docker_client: DockerClient) -> None:
    pins, resolved, rendered, built = demo_image
    stack = json.loads((pins.directory / "demo-stack" / "stack.json").read_text())
    v010 = stack["native"]["tinykernels"]["tags"]["v0.1.0"]
    data = engine.read_file(docker_client, built.image_id, "/opt/delivery/manifest.json")
    assert data is not None
    manifest = json.loads(data)
    vllm = manifest["components"]["vllm"]
    build = vllm["native_build"]
    assert (build["device"], build["device_var"], build["modules"]) == \
        ("cpu", "TINYENGINE_TARGET_DEVICE", ["tinyengine._C", "tinyengine._kernels"])
    [item] = build["inputs"]
    assert (item["name"], item["ref"], item["commit"], item["receive"]) == \
        ("tinykernels", "v0.1.0", v010, "TINYKERNELS_SRC_DIR")
    assert any("/tinyengine/_kernels." in path for path in vllm["native_libs"])
    assert manifest["base_records"]["torch"]["version"] == "2.13.0+cpu"
    smoke = docker_client.containers.run(built.image_id, ["python", "/opt/delivery/scripts/smoke.py",
                                                          "/opt/delivery/components.json"],
                                         network_mode="none", remove=True).decode()  # what the build's last step ran
    assert "smoke ok: vllm native tinyengine._kernels (/opt/venv/lib/python3.11/site-packages/tinyengine/_kernels." in smoke
    assert "smoke ok: the base's torch 2.13.0+cpu unchanged (every RECORD hash)" in smoke
    # offline supply: the toolchain file and the exported source travel in the context, nothing is fetched
    assert 'COPY ["native/vllm/", "/builder/native/vllm/"]' in rendered.dockerfile
    assert "CMAKE_TOOLCHAIN_FILE=/builder/native/vllm/toolchain.cmake" in rendered.dockerfile
    report = manifest_layers.native_build(pins, lock_record.of(pins))
    assert [(i["name"], i["commit"]) for i in report["inputs"]] == [("tinykernels", v010)]
    assert report["knobs"]["vllm"]["device"] == "cpu" and report["knobs"]["vllm"]["cmake"] is True


def test_undeclared_native_input_fails_the_offline_build_naming_it(demo_pins: Path, tmp_path: Path, settings: Settings) -> None:
    from demo.prepare import variant_pins
    from tests.conftest import _resolve_render_build

    pins = variant_pins(tmp_path, "vllm", 15, pins_path=demo_pins)  # tinyextra declared in csrc/extra/
    with pytest.raises(BuildFailed, match=r"builder: tinyengine: native input 'tinyextra' is not in the lock"):
        _resolve_render_build(pins)


def test_lock_check_names_a_changed_git_tag(demo_pins: Path, tmp_path: Path, settings: Settings) -> None:
    from demo.prepare import add_pr_commit, variant_pins

    pins_path = variant_pins(tmp_path, "vllm", 11, pins_path=demo_pins)
    kernels = tmp_path / "demo-stack" / "tinyengine.git"
    repo = pygit2.Repository(str(kernels))
    head = repo.references["refs/pull/11/head"].resolve().target
    text = repo[repo[head].tree["cmake/kernels.cmake"].id].data.decode()
    sha = add_pr_commit(kernels, 11, "cmake/kernels.cmake", text.replace("v0.1.0", "v0.2.0"),
                        "kernels: tinykernels 0.2.0\n")
    data = yaml.safe_load(pins_path.read_text())
    data["components"]["vllm"]["commit"] = sha
    pins_path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(StaleLock, match=r"stale: native input vllm/tinykernels: GIT_TAG v0.1.0 -> v0.2.0"):
        building.lock(pins_path, settings, check=True)
    assert native.parse((tmp_path / "locks" / "demo.lock").read_text()).inputs[0].ref == "v0.1.0"


def test_a_component_that_changes_the_bases_torch_fails_the_build(demo_pins: Path, tmp_path: Path, settings: Settings) -> None:
    """tinyrl ships a data file over torch/version.py (installed into its prefix, copied over the venv)."""
    from demo.prepare import add_pr_commit, variant_pins
    from tests.conftest import _resolve_render_build

    pins_path = variant_pins(tmp_path, "verl", 33, pins_path=demo_pins)
    repo = tmp_path / "demo-stack" / "tinyrl.git"
    add_pr_commit(repo, 33, "torch_patch/version.py", "__version__ = '2.14.0'\n", "vendor a torch version file\n")
    sha = add_pr_commit(repo, 33, "setup.py", "from setuptools import setup\n\nsetup(data_files=[("
                        "'lib/python3.11/site-packages/torch', ['torch_patch/version.py'])])\n", "install it\n")
    data = yaml.safe_load(pins_path.read_text())
    data["components"]["verl"]["commit"] = sha
    pins_path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(BuildFailed, match=r"builder: the base's torch 2.13.0\+cpu changed: ") as failed:
        _resolve_render_build(pins_path)
    assert any("/opt/venv/lib/python3.11/site-packages/torch/version.py: differs" in line  # the whole line, in full
               for line in failed.value.details)
