"""Cost proportional to the change (issue 20): per-layer source dates, so a newer commit of one
component re-stamps only its layers; the engine's layer cache keyed per pins, so another pins file's
identical layers on the same base never become this run's cache parent; normalised layers reused by
raw diff ID."""
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from builder.core.constants import CACHE_KEY_LABEL, COMPONENTS, SOURCE_DATE_EPOCH
from builder.core.options import Settings
from builder.core.records import BuiltImage, RenderedBuild, ResolvedSources
from builder.engine import client as engine
from builder.engine import normalize
from builder.image import build, render
from builder.image.dockerfile import instructions
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.pins.model import Pins
from builder.sources import resolve as sources
from tests.fixture_types import DemoImage

SETTINGS = Settings.from_env()


def times(**commit_times: int) -> ResolvedSources:
    """Stand-in with the commit times layer_epochs reads."""
    comps = {n: SimpleNamespace(commit_time=commit_times[n]) for n in COMPONENTS}
    return cast(ResolvedSources, SimpleNamespace(components=comps))


def test_each_layer_gets_the_date_of_what_it_installs() -> None:
    old = render.layer_epochs(times(vllm=100, megatron=200, verl=300), deps=True)
    assert old == [SOURCE_DATE_EPOCH] * 3 + [100, 200, 300] + [300, 300]
    newer_verl = render.layer_epochs(times(vllm=100, megatron=200, verl=900), deps=True)
    changed = [i for i, (a, b) in enumerate(zip(old, newer_verl, strict=True)) if a != b]
    assert changed == [5, 6, 7]  # verl, then the delivery files and the finish step after it
    assert render.layer_epochs(times(vllm=100, megatron=200, verl=300), deps=False) == old[1:]


def test_config_dates_each_history_entry_by_its_layer_and_drops_the_cache_key() -> None:
    raw = {"created": "2026-01-01T00:00:00Z", "config": {"Labels": {CACHE_KEY_LABEL: "k", "a": "b"}},
           "rootfs": {"type": "layers", "diff_ids": []},
           "history": [{"created": "2024-01-01T00:00:00Z", "created_by": "base"},
                       {"created": "2026-01-01T00:00:00Z", "created_by": f"LABEL {CACHE_KEY_LABEL}=k",
                        "empty_layer": True},
                       {"created": "2026-01-01T00:00:00Z", "created_by": "COPY a"},
                       {"created": "2026-01-01T00:00:00Z", "created_by": "COPY b"},
                       {"created": "2026-01-01T00:00:00Z", "created_by": "LABEL a=b", "empty_layer": True}]}
    config = json.loads(normalize.fixed_config(raw, 1, ["sha256:1", "sha256:2", "sha256:3"], [100, 200]))
    assert config["config"]["Labels"] == {"a": "b"}
    assert [h["created_by"] for h in config["history"]] == ["base", "COPY a", "COPY b", "LABEL a=b"]
    assert [h["created"] for h in config["history"]] == ["2024-01-01T00:00:00Z", normalize.iso(100),
                                                        normalize.iso(200), normalize.iso(200)]
    assert config["created"] == normalize.iso(200)


def test_the_cache_key_follows_the_pins_name_and_repository_not_the_commits() -> None:
    def pins(name: str, repository: str, verl: str, scope: str | None = None) -> Pins:  # what cache_key reads
        return cast(Pins, SimpleNamespace(name=name, image=SimpleNamespace(repository=repository, cache_scope=scope),
                                          components={"verl": SimpleNamespace(commit=verl)}))

    a = render.cache_key(pins("demo", "127.0.0.1:5000/demo/unified", "a" * 40))
    assert a == render.cache_key(pins("demo", "127.0.0.1:5000/demo/unified", "f" * 40))
    assert a != render.cache_key(pins("another", "127.0.0.1:5000/demo/unified", "a" * 40))
    assert a != render.cache_key(pins("demo", "127.0.0.1:5000/other", "a" * 40))
    # image.cache_scope: another pins file that names this one's scope shares its layers; one of its own does not
    assert a == render.cache_key(pins("fleet-b", "127.0.0.1:5000/fleet/b", "a" * 40, "demo@127.0.0.1:5000/demo/unified"))
    assert a != render.cache_key(pins("demo", "127.0.0.1:5000/demo/unified", "a" * 40, "nightly"))


# ---------------------------------------------------------------- Docker: real builds on the shared engine


def build_pins(path: Path, nocache: bool = False, locked: bool = False) -> tuple[RenderedBuild, BuiltImage]:
    """Render and build; `locked`: the caller holds the engine's build lock already."""
    pins = pins_mod.load(path)
    rendered = render.render(pins, lock_record.of(pins), sources.resolve(pins, SETTINGS), SETTINGS)
    if locked:
        return rendered, build.build_locked(rendered, SETTINGS, nocache, echo=False)
    return rendered, build.build(rendered, SETTINGS, nocache=nocache, echo=False)


def added_layers(built: BuiltImage) -> list[str]:
    manifest = normalize.blob_path(SETTINGS, built.manifest_digest).read_bytes()
    layers = [d["digest"] for d in json.loads(manifest)["layers"]]
    return layers


@pytest.mark.docker
@pytest.mark.slow
def test_a_newer_verl_commit_changes_only_verls_layers(demo_image: DemoImage, tmp_path: Path) -> None:
    import yaml

    from demo.prepare import add_pr_commit, variant_pins

    pins, resolved, rendered, built = demo_image
    out = variant_pins(tmp_path, pins_path=pins.path)
    sha = add_pr_commit(tmp_path / "demo-stack" / "tinyrl.git", 33, "NOTES.md", "a later verl commit\n",
                        "docs: notes\n")  # an hour after the PR head: the newest of the three
    data = yaml.safe_load(out.read_text())
    data["components"]["verl"]["commit"] = sha
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    moved = sources.resolve(pins_mod.load(out), SETTINGS)
    others = max(resolved.components[n].commit_time for n in ("vllm", "megatron"))
    assert moved.components["verl"].commit_time > max(others, resolved.components["verl"].commit_time)
    v_rendered, v_built = build_pins(out)
    try:
        old, new = added_layers(built), added_layers(v_built)
        base = len(old) - len(rendered.layer_epochs)
        verl_at = base + len(rendered.layer_epochs) - 3  # ..., verl, delivery, finish
        changed = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
        assert changed == [verl_at, verl_at + 1, verl_at + 2], (changed, base)
        # the unchanged raw layers were not normalised again: taken from the layer cache by diff ID (verl's
        # too when an earlier run on this engine built the same variant)
        record = next(normalize.store(SETTINGS, "records").glob(v_built.raw_image_id.removeprefix("sha256:") + "-*"))
        assert json.loads(record.read_text())["reused"] >= len(rendered.layer_epochs) - 3
    finally:
        engine.untag(engine.connect(SETTINGS), v_rendered.tag)


@pytest.mark.docker
@pytest.mark.slow
def test_another_pins_files_layers_on_the_same_base_never_break_this_runs_cache(demo_image: DemoImage, tmp_path: Path) -> None:
    """Pins B (another name, another verl) built with no cache after A: its ENV/COPY layers are identical
    to A's and newer, which the engine prefers as cache parent. With the per-pins cache key A still hits
    every step and gets the same digest; with B under A's name (planted: one key) A's verl step misses.
    Over 60 s under load (74 s in the last CI run): B's build runs every step, which is the point."""
    from demo.prepare import variant_pins

    pins, _, _, built = demo_image
    client = engine.connect(SETTINGS)

    def other(name: str, where: str) -> str:  # another job's plain `docker build --no-cache` of pins B
        from builder.image import ccache

        out = variant_pins(tmp_path / where, "verl", 35, edit=lambda d: d.update(name=name), pins_path=pins.path)
        other = pins_mod.load(out)
        rendered = render.render(other, lock_record.of(other), sources.resolve(other, SETTINGS), SETTINGS)
        seed = ccache.prepare(client, SETTINGS, rendered.labels, False)
        with open(rendered.context_path, "rb") as context:
            result = engine.build(client, context, rendered.tag, tmp_path / f"{where}.log", nocache=True,
                                  echo=False, buildargs={ccache.ARG: seed.tag})
        chains.append(result.steps)
        return rendered.tag

    chains: list[Any] = []

    # no-cache builds, as the builder's own: the engine's build lock held exclusively until their chains are
    # gone, so no other worker's build of A's cache key follows the planted chain meanwhile (and keeps it alive)
    with build.engine_lock(SETTINGS, exclusive=True):
        tags = [other("another-pins-on-this-engine", "b")]
        try:
            _, again = build_pins(pins.path, locked=True)
            assert again.cached and again.image_id == built.image_id and again.manifest_digest == built.manifest_digest
            tags.append(other(pins.name, "planted"))  # same name and repository: the same cache key as A
            _, planted = build_pins(pins.path, locked=True)
            chains.insert(0, [SimpleNamespace(**step) for step in json.loads(build.steps_file(planted).read_text())])
            assert not planted.cached  # the foreign verl-35 chain was taken as parent: verl installed again
            assert planted.image_id == built.image_id  # the normalised digest still does not depend on it
        finally:
            for tag in tags:
                engine.untag(client, tag)
            for steps in chains:  # planted's steps on them, then the foreign chains: they would shadow A's cache
                build.drop_chain(client, steps)


def test_layer_dates_must_match_the_layers_the_build_added() -> None:
    from builder.core.errors import BuildFailed

    assert normalize._epochs(7, 3, "t") == [7, 7, 7]
    assert normalize._epochs([1, 2, 3], 3, "t") == [1, 2, 3]
    with pytest.raises(BuildFailed, match="the build added 4 layers, the render planned 3 layer times"):
        normalize._epochs([1, 2, 3], 4, "t")


def test_a_layer_normalised_once_is_found_by_its_raw_diff_id_until_its_blob_goes(tmp_path: Path) -> None:
    import dataclasses
    import io
    import tarfile

    settings = dataclasses.replace(SETTINGS, cache_root=tmp_path)
    raw = tmp_path / "raw.tar"
    with tarfile.open(raw, "w") as tar:
        info = tarfile.TarInfo("opt/x")
        info.size, info.mtime = 3, 2_000_000_000
        tar.addfile(info, io.BytesIO(b"abc"))
    raw_id = "sha256:" + "1" * 64
    assert normalize.cached_layer(settings, raw_id, 100) is None
    entry = normalize.normalise_one(raw, 100, raw_id, settings, tmp_path)
    assert normalize.cached_layer(settings, raw_id, 100) == entry
    assert normalize.cached_layer(settings, raw_id, 200) is None  # another date is another layer
    normalize.blob_path(settings, entry["digest"]).unlink()  # planted: the blob is gone
    assert normalize.cached_layer(settings, raw_id, 100) is None


def test_each_stage_on_the_base_starts_with_its_own_cache_key() -> None:
    """The same first instruction in two stages shares one image: after a nocache build the newest one
    (the engine's pick) would be the runtime stage's, which has no build-stage children."""
    from builder.image import dockerfile

    text = dockerfile.render_text({"builder_version": "0", "pins_name": "p", "base_image": "b@sha256:" + "0" * 64,
                                   "python": "/v/bin/python", "venv": "/v", "build_env": {}, "source_date_epoch": 0,
                                   "deps": False, "build_deps": False, "components": [], "prefixes": [], "labels": {"a": "b"},
                                   "cache_key_label": CACHE_KEY_LABEL, "cache_key": "k"})
    firsts = [line for line in text.splitlines() if line.startswith(f"LABEL {CACHE_KEY_LABEL}=")]
    assert firsts == [f"LABEL {CACHE_KEY_LABEL}=k.prepare", f"LABEL {CACHE_KEY_LABEL}=k.runtime"]


# ---------------------------------------------------------------- issue 28, item 10: this run's stage times


class _Api:
    """The two engine calls a normalisation cache hit makes: inspect (the raw image, the stored image) and tag."""

    def __init__(self, layers: list[str]) -> None:
        self.layers: list[str] = layers
        self.tagged: list[tuple[str, str]] = []

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return {"Id": ref, "RootFS": {"Layers": self.layers}}

    def tag(self, image_id: str, name: str, tag: str, force: bool = False) -> bool:
        self.tagged.append((image_id, f"{name}:{tag}"))
        return True


def test_a_stored_normalisation_is_reused_with_this_runs_seconds_and_marked_cached(tmp_path: Path) -> None:
    import dataclasses

    settings = dataclasses.replace(SETTINGS, cache_root=tmp_path)
    base = ["sha256:" + "b" * 64]
    raw_id, image_id, manifest = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64
    key = hashlib.sha256(json.dumps([100]).encode()).hexdigest()[:16]
    stored = normalize.Normalized(image_id=image_id, manifest_digest=manifest, raw_image_id=raw_id, source_date_epoch=100,
                                  base_layers=1, layers=[], diff_ids=[], seconds=0.977, layer_epochs=[100],
                                  times={"normalise": 0.5})
    record = normalize.store(settings, "records") / f"{raw_id.removeprefix('sha256:')}-{key}.json"
    record.write_text(json.dumps(dataclasses.asdict(stored)))
    normalize.blob_path(settings, manifest).parent.mkdir(parents=True, exist_ok=True)
    normalize.blob_path(settings, manifest).write_bytes(b"{}")
    client = SimpleNamespace(api=_Api(base + ["sha256:" + "c" * 64]))
    got = normalize.normalize(client, raw_id, "builder-run/x:tag", {"rootfs": {"diff_ids": base}}, [{}], [100], settings)
    assert got.cached and got.image_id == image_id and client.api.tagged == [(image_id, "builder-run/x:tag")]
    assert got.seconds != 0.977 and got.times == {}  # this run's lookup, not the stored run's
    assert json.loads(record.read_text())["seconds"] == 0.977  # the record itself is left as it was


def test_stage_groups_whose_steps_all_hit_the_cache_are_marked_cached() -> None:
    from builder.engine.client import Step

    text = ("FROM b AS prepare\n# stage: deps\nRUN a\nRUN b\nFROM b AS runtime\n# stage: vllm\nRUN c\n"
            "# stage: verl\nRUN d\n")
    names = [instruction for _, instruction in instructions(text)]
    steps = [Step(i, len(names), instruction, cached=instruction != "RUN d") for i, instruction in enumerate(names, 1)]
    assert [g for g, _ in instructions(text)] == ["prepare", "deps", "deps", "deps", "vllm", "verl"]
    assert build.cached_stages(text, steps) == ["deps", "vllm"]  # verl's step ran
    steps[0].cached = steps[3].cached = False  # FROM never says `Using cache`
    assert build.cached_stages(text, steps) == ["deps", "vllm"]


@pytest.mark.docker
@pytest.mark.slow
def test_a_cached_rebuilds_report_shows_this_runs_times(demo_image: Any) -> None:
    """A rebuild where every step and the normalisation are reused: the report's stage times are this run's,
    and those stages are marked cached (not the first build's 0.977 s normalise)."""
    from builder.report import document

    pins, resolved, _, built = demo_image
    _, again = build_pins(pins.path)
    record = next(normalize.store(SETTINGS, "records").glob(again.raw_image_id.removeprefix("sha256:") + "-*"))
    stored = json.loads(record.read_text())["seconds"]
    assert again.cached and "normalise" in again.cached_stages
    assert again.stage_times["normalise"] != stored and again.stage_times["normalise"] < stored
    md = document.to_markdown(document.make_report(pins, lock_record.of(pins), resolved, again, None))
    assert f"normalise {again.stage_times['normalise']:.1f} s (cached)" in md
