"""What an image's identity depends on: the one place that says which pins fields are build inputs.

The image holds what it was built from and nothing else, so that its digest moves only when what was built moves.
In: the base (the reference as written, registry host included, and its platform manifest digest), platform and
Python, each component's remote as written, commit, tree, PR, distribution and install options, the native inputs,
the lock's lines (its sha256 is the report's) and the build env. Out: `name`, `image` (repository, tags, staging,
cache scope), `recipe`, `acceptance` (Slurm site options included), `nightly`, the lock's path, the reasons of
compat pins (their effect is in the lock's lines) and any path of the building machine. The excluded fields stay in
the report and in the signed provenance (SLSA externalParameters)."""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from builder.core.constants import COMPONENTS
from builder.pins.model import Pins

# per component: what the build reads (the target branch only places the PR; it builds nothing)
COMPONENT_INPUTS = ("url", "pr", "commit", "distribution", "modules", "install", "native", "base_torch")
EXCLUDED = ("name", "image", "recipe", "acceptance", "nightly", "build.lock", "compat", "direct_urls", "shared",
            "components.*.target")


def build_inputs(pins: Pins, base_image: str | None = None) -> dict[str, Any]:
    """The pins' build inputs as JSON (what /opt/delivery/pins.json holds): nothing of EXCLUDED. `base_image`: the
    base by its platform manifest, when the pins name an index (the index digest stays outside the image)."""
    data = pins.to_json_dict()
    base = {k: data["base"][k] for k in ("image", "platform", "python", "python_bin")}
    base["image"] = base_image or base["image"]
    return {
        "schema_version": data["schema_version"],
        "base": base,
        "components": {name: {k: data["components"][name][k] for k in COMPONENT_INPUTS} for name in COMPONENTS},
        "build": {"env": data["build"]["env"], "constraints": data["build"]["constraints"]},
    }


def source_url(remote: str) -> str | None:
    """The OCI source annotation: a network URL (https, http, ssh, git) as written; None for a path or file URL
    (a building machine's path never reaches the image)."""
    parts = urlsplit(remote)
    if parts.scheme in ("https", "http", "git", "ssh") and parts.netloc:
        return remote
    return None
