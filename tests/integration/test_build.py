"""build(): the demo image through the Docker engine (network none), its labels, manifest and cache."""
import gc
import json
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from builder.core.constants import COMPONENTS
from builder.core.errors import BuildFailed, InfraError
from builder.core.options import PACKAGE, Settings
from builder.core.records import BuiltImage
from builder.engine import client as engine
from builder.image import build, dockerfile, identity, render
from builder.lock import record as lock_record
from builder.pins import model as pins_mod
from builder.pins.model import Pins
from builder.sources import resolve as sources
from demo.prepare import variant_pins
from tests.conftest import SETTINGS  # the session's settings: one run ID, so the fixtures' local tags
from tests.fixture_types import BuildVariant, DemoImage, DockerClient


def run_in(client: DockerClient, image: str, argv: list[str]) -> tuple[int, str]:
    """Run argv in a fresh network-none container of image; (exit code, output); container removed."""
    container = client.containers.create(image, argv, network_mode="none")
    try:
        container.start()
        rc = container.wait(timeout=300)["StatusCode"]
        return rc, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def read_json(client: DockerClient, image: str, path: str) -> dict[str, Any]:
    rc, out = run_in(client, image, ["cat", path])
    assert rc == 0, out
    data: dict[str, Any] = json.loads(out)
    return data


@pytest.mark.docker
def test_labels_and_manifest(demo_image: DemoImage, docker_client: DockerClient) -> None:
    pins, resolved, rendered, built = demo_image
    attrs = docker_client.api.inspect_image(built.image_id)
    # the run that built it (maybe another xdist worker's: tests/shared.py) tagged it; other runs of the same
    # image add their own run's local names meanwhile
    sha = build.local_tag(rendered, SETTINGS).rpartition(":")[2]
    local = [t for t in built.tags if t.startswith(build.LOCAL_REPOSITORY + "/") and t.endswith(":" + sha)]
    assert local and set(local) <= set(attrs["RepoTags"])
    labels = attrs["Config"]["Labels"]
    assert {k: labels.get(k) for k in rendered.labels} == rendered.labels
    for name in COMPONENTS:
        assert labels[f"io.truepolicy.{name}.commit"] == pins.components[name].commit
    manifest = read_json(docker_client, built.image_id, "/opt/delivery/manifest.json")
    assert manifest["schema"] == 1
    assert manifest["dockerfile_sha256"] == rendered.dockerfile_sha256 == built.dockerfile_sha256
    assert manifest["base"] == {"image": pins.base.image, "digest": pins.base.digest}
    assert manifest["pins"] == identity.build_inputs(pins)  # the build inputs only: no name, repository or recipe
    assert labels.get("org.opencontainers.image.title") != pins.name and pins.name not in json.dumps(manifest)
    assert manifest["python"] == pins.base.python_bin
    assert any(manifest["python"] in i["names"] and len(i["sha256"]) == 64 for i in manifest["interpreters"])
    for name in COMPONENTS:
        comp, res = manifest["components"][name], resolved.components[name]
        assert (comp["commit"], comp["tree"], comp["pr"]) == (res.commit, res.tree, res.pr)
        assert comp["distribution"] == pins.components[name].distribution
        stamp = [p for p in comp["files"] if p.endswith("BUILDER_PROVENANCE.json")]
        assert len(stamp) == 1 and all(p.startswith(manifest["site_packages"]) for p in comp["files"])
        assert json.loads(run_in(docker_client, built.image_id, ["cat", stamp[0]])[1])["commit"] == res.commit
    # the vllm-role package ships two C extensions (setuptools' _C, CMake's _kernels): listed and hashed as built
    native = manifest["components"]["vllm"]["native_libs"]
    assert sorted(p.rsplit("/", 1)[1].split(".")[0] for p in native) == ["_C", "_kernels"]
    for so_path, so_sha in native.items():
        rc, out = run_in(docker_client, built.image_id, ["sha256sum", so_path])
        assert rc == 0 and out.split()[0] == so_sha


def _build_env(demo_image: DemoImage, tmp_path: Path) -> tuple[Pins, dict[str, Any]]:
    """What the build container reported: from the demo build, or (when that step came from the cache)
    from a no-cache build of a copy of the demo pins under another repository."""
    pins, _, _, built = demo_image
    if built.isolation.get("checked"):
        assert built.isolation["problems"] == []
        return pins, {"net": built.isolation["net"], "mountinfo": built.isolation["mountinfo"]}

    def elsewhere(data: dict[str, Any]) -> None:
        data["image"]["repository"] = "127.0.0.1:5000/builder-tests/isolation"
    other = pins_mod.load(variant_pins(tmp_path, edit=elsewhere, pins_path=pins.path))
    rendered = render.render(other, lock_record.of(other), sources.resolve(other, SETTINGS), SETTINGS)
    other_built = build.build(rendered, SETTINGS, nocache=True, echo=False)
    engine.untag(engine.connect(SETTINGS), build.local_tag(rendered, SETTINGS))
    assert other_built.isolation.get("checked"), "the runtime stage printed no BUILD-ENV line"
    return pins, {"net": other_built.isolation["net"], "mountinfo": other_built.isolation["mountinfo"]}


@pytest.mark.docker
def test_build_container_had_no_network_and_no_source_mounts(demo_image: DemoImage, docker_client: DockerClient,
                                                             tmp_path: Path) -> None:
    pins, env = _build_env(demo_image, tmp_path)
    built = demo_image[3]
    host_paths = [str(PACKAGE.parent), str(SETTINGS.cache_root), str(pins.directory)]
    assert env["net"] == ["lo"]
    assert build.isolation_problems(env, host_paths) == []
    # the same check fails on what a bind mount of sources or a bridge network would leave
    planted = dict(env, mountinfo=env["mountinfo"] + [
        f"120 80 254:0 {pins.directory}/demo-stack /builder/src rw,relatime - ext4 /dev/vda rw"])
    assert any("/builder/src" in p for p in build.isolation_problems(planted, host_paths))
    assert build.isolation_problems(dict(env, net=["eth0", "lo"]), host_paths)
    # nothing of the build stage, and nothing per-build, reaches the final image
    rc, out = run_in(docker_client, built.image_id, ["ls", "/builder", "/install", "/root/.cache/pip",
                                                     "/opt/delivery/build-env.json"])
    assert rc != 0 and out.count("No such file") == 4


@pytest.mark.docker
def test_rebuild_with_nothing_changed_is_a_full_cache_hit(demo_image: DemoImage) -> None:
    pins, resolved, rendered, built = demo_image
    again = render.render(pins, lock_record.of(pins), sources.resolve(pins, SETTINGS), SETTINGS)
    assert again.context_sha256 == rendered.context_sha256
    rebuilt = build.build(again, SETTINGS, echo=False)  # how fast: benchmarks/bench_build.py, not a timed test
    assert rebuilt.image_id == built.image_id
    assert rebuilt.cached is True, [s for s in json.loads(build.steps_file(rebuilt).read_text())
                                    if not s["cached"] and not s["instruction"].startswith(("FROM ", "ARG "))][:3]


def layers_by_group(built: BuiltImage, text: str) -> dict[str, list[str]]:
    """Image ID each step produced, grouped by the Dockerfile's `# stage:` comments."""
    groups = dockerfile.instructions(text)
    out: dict[str, list[str]] = {}
    for step in json.loads(build.steps_file(built).read_text()):
        if step["step"] == 1 and step["instruction"].startswith("ARG "):
            continue  # the global ARG (the compiler cache seed) before the first FROM makes no image
        assert step["image"], step
        out.setdefault(groups[step["step"] - 1][0], []).append(step["image"])
    return out


@pytest.mark.docker
def test_verl_change_reuses_the_vllm_and_megatron_layers(demo_image: DemoImage, build_variant: BuildVariant) -> None:
    _, _, rendered, built = demo_image
    variant = build_variant("verl", 34)
    assert variant.image_id != built.image_id
    ours = layers_by_group(built, rendered.dockerfile)
    theirs = layers_by_group(variant, (Path(variant.log_path).parent / "Dockerfile").read_text())
    for group in ("prepare", "deps", "vllm", "megatron", "acceptance"):
        assert theirs[group] == ours[group], group
    assert theirs["verl"][0] != ours["verl"][0]  # from the COPY of the new sources on


@pytest.mark.docker
def test_failing_install_step_names_the_step_and_leaves_no_tag(demo_pins: Path, docker_client: DockerClient,
                                                               tmp_path: Path) -> None:
    def bad_pip_arg(data: dict[str, Any]) -> None:  # allowed by the pins, but pip cannot check hashes of a source directory
        data["components"]["verl"]["install"]["pip_args"] = ["--no-deps", "--require-hashes"]

    pins = pins_mod.load(variant_pins(tmp_path, "verl", 35, edit=bad_pip_arg, pins_path=demo_pins))
    rendered = render.render(pins, lock_record.of(pins), sources.resolve(pins, SETTINGS), SETTINGS)
    before = engine.inspect_image(docker_client, build.local_tag(rendered, SETTINGS))
    with pytest.raises(BuildFailed) as failed:
        build.build(rendered, SETTINGS, echo=False)
    message, step = str(failed.value), failed.value.details[0]
    assert step.startswith("step: ") and "install.py" in step and "/install/verl" in step and "--require-hashes" in step
    assert "step " in message and "log " in message and "\n" not in message and len(message) <= 300
    assert failed.value.details and any("hashes" in line for line in failed.value.details)
    after = engine.inspect_image(docker_client, build.local_tag(rendered, SETTINGS))
    assert (after is None) if before is None else after is not None and after["Id"] == before["Id"]


@pytest.mark.docker
def test_smoke_and_manifest_scripts_fail_on_planted_defects(demo_image: DemoImage, docker_client: DockerClient) -> None:
    pins, resolved, _, built = demo_image
    spec = read_json(docker_client, built.image_id, "/opt/delivery/components.json")
    smoke = ["/opt/venv/bin/python", "-B", "/opt/delivery/scripts/smoke.py"]
    rc, out = run_in(docker_client, built.image_id, smoke + ["/opt/delivery/components.json"])
    assert rc == 0 and "BUILD-ENV " in out, out
    spec["components"]["megatron"]["commit"] = "0" * 40
    tampered = json.dumps(spec)
    rc, out = run_in(docker_client, built.image_id, ["sh", "-c", f"printf '%s' '{tampered}' > /tmp/c.json && "
                                                     + " ".join(smoke) + " /tmp/c.json"])
    assert rc != 0 and "stamped commit" in out
    manifest = read_json(docker_client, built.image_id, "/opt/delivery/manifest.json")
    victim = next(p for p in manifest["components"]["verl"]["files"] if p.endswith(".py"))
    write = ("/opt/venv/bin/python -B /opt/delivery/scripts/write_manifest.py /opt/delivery/components.json"
             " /opt/delivery/pins.json /opt/delivery/dockerfile.sha256 /tmp/m.json")
    rc, out = run_in(docker_client, built.image_id, ["sh", "-c", write])
    assert rc == 0, out
    rc, out = run_in(docker_client, built.image_id, ["sh", "-c", f"echo '# changed' >> {victim} && {write}"])
    assert rc != 0 and "does not match its RECORD hash" in out


def test_unreachable_engine_is_an_infra_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(InfraError) as err:
        engine.connect(Settings.from_env(), timeout=5)
    assert err.value.exit_code == 3 and "docker engine" in str(err.value)
    # the docker SDK never closes the socket of the client it failed to make (warnings are errors): it goes here
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del err
        gc.collect()


def test_progress_joins_a_line_split_over_stream_chunks(tmp_path: Path) -> None:
    """The engine may cut one long output line (the BUILD-ENV record) across chunks: it is read whole."""
    record = '{"net": ["lo"], "mountinfo": ["' + "x" * 5000 + '"]}'
    with open(tmp_path / "log", "w") as log_file:
        progress = engine._Progress(log_file, echo=False)
        for chunk in ("Step 1/1 : RUN [\"true\"]\n", " ---> Running in 0123\nBUILD-ENV " + record[:1000],
                      record[1000:4000], record[4000:] + "\n", "tail without newline"):
            progress.chunk({"stream": chunk})
        progress.finish()
    assert build.build_env(progress.steps) == json.loads(record)
    assert progress.steps[-1].lines[-1] == "tail without newline"


@pytest.mark.docker
def test_a_build_untags_other_runs_local_names_older_than_a_day(demo_image: DemoImage, docker_client: DockerClient) -> None:
    """A nightly must not pin one image per night: the next build removes other runs' stale local tags
    and keeps fresh ones, its own and hand-named ones."""
    built = demo_image[3]
    now = time.time()
    old_run = time.strftime("%Y%m%d%H%M%S", time.gmtime(now - build.RUN_TAG_MAX_AGE_S - 60)) + "-0ld0ld00"
    fresh_run = time.strftime("%Y%m%d%H%M%S", time.gmtime(now - 60)) + "-fre5h000"
    tags = {name: f"{build.LOCAL_REPOSITORY}/{name}:sweep-test" for name in (old_run, fresh_run, "by-hand")}
    image = docker_client.images.get(built.image_id)
    for tag in tags.values():
        repo, _, name = tag.partition(":")
        image.tag(repo, name)
    try:
        removed = build.sweep_run_tags(docker_client, SETTINGS, now=now)
        # this sweep removed the old tag, or a build of another test swept it first (builds sweep hourly)
        assert not {tags[fresh_run], tags["by-hand"]} & set(removed)
        left = set(docker_client.images.get(built.image_id).tags)
        assert tags[fresh_run] in left and tags["by-hand"] in left and tags[old_run] not in left
    finally:
        for tag in tags.values():
            engine.untag(docker_client, tag)
