"""One image, one identity (builder/image/identity.py): every pins field that is not a build input leaves the
rendered Dockerfile, the labels and every context file unchanged; a build input changes them."""
import copy
import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.core.records import ResolvedComponent, ResolvedSources
from builder.engine.platforms import BaseManifest
from builder.image import context, identity, render
from builder.lock import record as lock_record
from builder.pins import model as pins_mod

PROJECT = Path(__file__).resolve().parents[2]
DEMO = yaml.safe_load((PROJECT / "pins" / "demo.yaml").read_text())
Edit = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return edit


def _target(data: dict[str, Any]) -> None:
    for comp in data["components"].values():
        comp["target"] = "release/1.0"


def _cluster(data: dict[str, Any]) -> None:  # the demo-cluster pins' difference, a site path included
    _set("acceptance.nodes", 2)(data)
    _set("acceptance.slurm", {"node_local_dir": "/work/site/%n/images", "partition": "gpu"})(data)


EXCLUDED: dict[str, Edit] = {
    "name": _set("name", "another-name"),
    "image.repository": _set("image.repository", "registry.example.com/team/unified"),
    "image.tags": _set("image.tags", ["nightly", "v1"]),
    "image.staging": _set("image.staging", "registry.example.com/team/staging"),
    "image.cache_scope": _set("image.cache_scope", "another-scope"),
    "recipe": _set("recipe.env", {"EXTRA": "1"}),
    "acceptance.timeout_s": _set("acceptance.timeout_s", 300),
    "acceptance.performance": _set("acceptance.performance.min_ratio", 0.3),
    "acceptance.nodes+slurm": _cluster,
    "nightly": _set("nightly.retention", 3),
    "components.*.target": _target,
    "build.lock": _set("build.lock", "locks/elsewhere/demo.lock"),
}


def _rendered(tmp: Path, edit: Edit | None = None, where: str = "a", base: BaseManifest | None = None) -> dict[str, bytes]:
    """Every context file but the sources and wheels, the Dockerfile and the labels, for the demo pins edited."""
    data = copy.deepcopy(DEMO)
    data["base"]["image"] = "127.0.0.1:5000/demo/base@sha256:" + "cd" * 32
    for name in ("vllm", "megatron", "verl"):
        data["components"][name]["commit"] = hashlib.sha1(name.encode()).hexdigest()
    if edit is not None:
        edit(data)
    root = tmp / where
    lock = root / data["build"]["lock"]
    lock.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT / "pins" / "locks" / "demo.lock", lock)
    (root / "pins.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    pins = pins_mod.load(root / "pins.yaml")
    comps = {name: ResolvedComponent(
        name=name, url=str(root / comp.url), target=comp.target, pr=comp.pr, commit=comp.commit,
        tree=hashlib.sha1(b"tree" + name.encode()).hexdigest(), commit_time=946684800, pr_head=comp.commit,
        pr_moved=False, merge_base="0" * 40, ahead=2, behind=1, target_head="1" * 40, export_sha256="2" * 64,
        files=7) for name, comp in pins.components.items()}
    sources = ResolvedSources(pins_path=str(pins.path), pins_sha256=pins.sha256, resolved_at="2026-11-01T00:00:00Z",
                              components=comps)
    locked = lock_record.of(pins)
    text = render.render_dockerfile(pins, locked, sources, base)
    delivery = render.delivery_components(pins, locked, sources, render.sha_tag(pins), base)
    files = context.small_files(pins, locked, text, render.dockerfile_sha256(pins, text), delivery, None)
    out = {k: v for k, v in files.items() if isinstance(v, bytes)}
    # the build file itself is not in the image; its cache-key label is dropped by engine/normalize.py
    out["Dockerfile"] = text.replace(render.cache_key(pins), "<cache-key>").encode()
    out["labels"] = repr(sorted(render.labels(pins, sources, base.digest if base else None).items())).encode()
    return out


@pytest.mark.parametrize("field", list(EXCLUDED))
def test_a_field_that_is_not_a_build_input_changes_nothing_in_the_image(tmp_path: Path, field: str) -> None:
    assert _rendered(tmp_path, EXCLUDED[field]) == _rendered(tmp_path, where="b")


def test_every_excluded_field_at_once_and_another_checkout_path(tmp_path: Path) -> None:
    def everything(data: dict[str, Any]) -> None:
        for edit in EXCLUDED.values():
            edit(data)
    assert _rendered(tmp_path / "x" / "deeper", everything) == _rendered(tmp_path)


@pytest.mark.parametrize("edit", [_set("build.env", {"MAX_JOBS": "3"}), _set("components.verl.commit", "e" * 40),
                                  _set("components.vllm.install.pip_args", ["--no-build-isolation"]),
                                  _set("base.image", "127.0.0.1:5001/demo/base@sha256:" + "cd" * 32)],
                         ids=["build.env", "commit", "install", "base registry"])
def test_a_build_input_changes_the_image(tmp_path: Path, edit: Edit) -> None:
    assert _rendered(tmp_path, edit) != _rendered(tmp_path, where="b")


def test_the_image_names_no_pins_name_no_repository_and_no_path(tmp_path: Path) -> None:
    files = _rendered(tmp_path, _set("image.repository", "registry.example.com/team/unified"))
    blob = b"".join(files.values())
    assert DEMO["name"].encode() not in blob and b"registry.example.com" not in blob
    assert str(tmp_path).encode() not in blob


@pytest.mark.parametrize("remote, url", [("https://github.com/volcengine/verl.git", "https://github.com/volcengine/verl.git"),
                                         ("ssh://git@host/x.git", "ssh://git@host/x.git"),
                                         ("demo-stack/tinyrl.git", None), ("/srv/mirrors/verl.git", None),
                                         ("file:///srv/mirrors/verl.git", None)])
def test_the_source_label_is_a_url_or_absent(remote: str, url: str | None) -> None:
    assert identity.source_url(remote) == url


def test_one_platform_manifest_pinned_by_its_index_or_by_itself_gives_one_image(tmp_path: Path) -> None:
    """The index digest stays outside the image: pinned by the index (resolved to its amd64 entry, the demo's
    manifest), the context is the one the platform manifest's pin gives; another platform manifest changes it."""
    index = "127.0.0.1:5000/demo/base@sha256:" + "1e" * 32
    resolved = BaseManifest("127.0.0.1:5000/demo/base", "sha256:" + "cd" * 32, index_digest="sha256:" + "1e" * 32)
    by_index = _rendered(tmp_path, _set("base.image", index), base=resolved)
    assert by_index == _rendered(tmp_path, where="b")
    assert b"1e1e1e1e" not in b"".join(by_index.values())
    other = BaseManifest(resolved.name, "sha256:" + "ab" * 32, index_digest=resolved.index_digest)
    assert _rendered(tmp_path, _set("base.image", index), where="c", base=other) != by_index
