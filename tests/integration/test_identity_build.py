"""One image, one identity, end to end: a cold build of the demo pins with every field that is not a build input
changed at once (name, repository, tags, staging, cache scope, recipe, acceptance with a Slurm site section and a
node-local path of another checkout, nightly), from pins in another directory, gets the demo's image ID."""
from pathlib import Path
from typing import Any

import pytest

from demo.prepare import variant_pins
from tests.conftest import _resolve_render_build
from tests.fixture_types import DemoImage

pytestmark = pytest.mark.docker


def test_settings_that_are_not_build_inputs_leave_the_image_id(demo_image: DemoImage, tmp_path: Path) -> None:
    """A cold build (its own cache scope, so no layer of the demo's is reused): about 30 s idle. Over 60 s under
    load (67 s in the last CI run): the build must be cold, or the image ID would be reused, not made again."""
    checkout = tmp_path / "another" / "checkout"

    def everything(data: dict[str, Any]) -> None:
        data["name"] = "identity-other-name"
        data["image"] = {"repository": "127.0.0.1:5000/identity/elsewhere", "tags": ["nightly", "v9"],
                         "staging": "127.0.0.1:5000/identity/staging", "cache_scope": "identity-cold-build"}
        data["recipe"]["env"] = {**data["recipe"].get("env", {}), "IDENTITY_EXTRA": "1"}
        data["nightly"] = {"regression_threshold": 0.2, "retention": 2}
        acc = data["acceptance"]
        acc["timeout_s"], acc["nodes"] = 300, 2
        acc["slurm"] = {"node_local_dir": f"{checkout}/nodes/%n", "partition": "debug"}
        acc["performance"]["min_ratio"] = 0.3

    pins_path = variant_pins(checkout, edit=everything, pins_path=demo_image[0].path)
    other = _resolve_render_build(pins_path)
    assert other[0].name != demo_image[0].name and other[0].image.repository != demo_image[0].image.repository
    assert other[3].image_id == demo_image[3].image_id
    assert other[2].dockerfile_sha256 == demo_image[2].dockerfile_sha256
