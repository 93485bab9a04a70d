"""Render the unified Dockerfile (jinja2, dockerfiles/) and assemble its build context.

`render(pins, sources)` is pure in its inputs: the same pins and the same resolved sources give a
byte-identical Dockerfile and the same context sha256, whatever the cwd or cache dir.
"""
from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import jinja2

from builder import __version__ as BUILDER_VERSION
from builder import scmversion
from builder.errors import BadInput
from builder.records import RenderedBuild, ResolvedSources

COMPONENTS = ("vllm", "megatron", "verl")
TEMPLATES = Path(__file__).resolve().parent.parent / "dockerfiles"
TEMPLATE = "unified.Dockerfile.j2"
# fixed mtime of every context file and SOURCE_DATE_EPOCH of the build (2000-01-01; zip needs >= 1980)
SOURCE_DATE_EPOCH = 946684800
BASE_RX = re.compile(r"[a-z0-9][a-z0-9.:/_-]*@sha256:[0-9a-f]{64}")
ENV_KEY_RX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNSAFE_RX = re.compile(r"[\x00-\x1f\x7f$]")


def dq(value) -> str:
    """JSON-quote a value for the Dockerfile; refuse newline/CR/control characters and `$`
    (defence in depth behind pins validation)."""
    text = str(value)
    if UNSAFE_RX.search(text):
        raise BadInput(f"Dockerfile value {text!r}: expected no newline, carriage return, control character or '$'")
    return json.dumps(text)


def argv(values) -> str:
    """An exec-form JSON array, each element through dq."""
    return "[" + ", ".join(dq(v) for v in values) + "]"


def labelpairs(mapping) -> str:
    """`"key"="value"` pairs of one LABEL instruction, sorted, one per continuation line."""
    return " \\\n      ".join(f"{dq(k)}={dq(v)}" for k, v in items(mapping))


def envkey(value) -> str:
    text = str(value)
    if not ENV_KEY_RX.fullmatch(text):
        raise BadInput(f"Dockerfile env name {text!r}: expected [A-Za-z_][A-Za-z0-9_]*")
    return text


def items(mapping) -> list:
    """Sorted items of a dict: templates never iterate a dict in insertion order."""
    return sorted(mapping.items())


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(dq=dq, argv=argv, envkey=envkey, items=items, labelpairs=labelpairs)
    return env


def sha_tag(pins) -> str:
    """`vllm-<12hex>.megatron-<12hex>.verl-<12hex>` from the three pinned commits."""
    return ".".join(f"{name}-{pins.components[name].commit[:12]}" for name in COMPONENTS)


def image_ref(pins) -> str:
    return f"{pins.image.repository}:{sha_tag(pins)}"


UNRESOLVED = "unresolved"


def created(sources: ResolvedSources | None) -> str:
    """Newest commit time of the three, ISO 8601 UTC (keeps the label reproducible)."""
    if sources is None:
        return UNRESOLVED
    newest = max(sources.components[name].commit_time for name in COMPONENTS)
    return datetime.fromtimestamp(newest, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def venv_root(pins) -> str:
    """The venv the base interpreter belongs to (python_bin = <venv>/bin/python)."""
    return str(Path(pins.base.python_bin).parent.parent)


def _tree(sources: ResolvedSources | None, name: str) -> str:
    return sources.components[name].tree if sources else UNRESOLVED


def labels(pins, sources: ResolvedSources | None) -> dict[str, str]:
    verl = pins.components["verl"]
    out = {
        "org.opencontainers.image.source": verl.url,
        "org.opencontainers.image.revision": verl.commit,
        "org.opencontainers.image.created": created(sources),
        "org.opencontainers.image.version": sha_tag(pins),
        "org.opencontainers.image.base.name": pins.base.name,
        "org.opencontainers.image.base.digest": pins.base.digest,
        "org.opencontainers.image.title": pins.name,
    }
    for name in COMPONENTS:
        comp = pins.components[name]
        out[f"io.truepolicy.{name}.commit"] = comp.commit
        out[f"io.truepolicy.{name}.tree"] = _tree(sources, name)
        out[f"io.truepolicy.{name}.pr"] = str(comp.pr)
    return out


def component_entries(pins, sources: ResolvedSources | None, build_prefixes: list[str] | None = None) -> list[dict]:
    """Per-component template data, in install order (sources None: pins-only review render).
    build_prefixes (the lock's build-only and runtime wheels) are importable while each installs."""
    out, earlier = [], []
    build_prefixes = list(build_prefixes or [])
    for name in COMPONENTS:
        comp = pins.components[name]
        if sources and sources.components[name].commit != comp.commit:
            raise BadInput(f"components.{name}.commit: resolved {sources.components[name].commit}, "
                           f"pinned {comp.commit}")
        prefix = f"/install/{name}"
        scm = sources.components[name].version if sources else ""
        env_map = dict(comp.install.env)
        if scm:  # the exported tree has no .git: the version computed from the mirror, validated
            env_map[scmversion.pretend_env_name(comp.distribution)] = scmversion.checked(scm)
        env = [f"{envkey(k)}={v}" for k, v in items(env_map)]
        out.append({"name": name, "prefix": prefix, "commit": comp.commit, "tree": _tree(sources, name), "pr": comp.pr,
                    "url": comp.url, "target": comp.target, "distribution": comp.distribution,
                    "modules": list(comp.modules), "pip_args": list(comp.install.pip_args), "env": env,
                    "scm_version": scm, "earlier": build_prefixes + list(earlier)})  # importable while this one installs
        earlier.append(prefix)
    return out


def lock_parts(lock_path: Path) -> tuple[bool, bool]:
    """(has runtime entries, has build-only entries) of a lock (see builder/lock.py)."""
    from builder.lock import split_lock

    runtime, build = split_lock(Path(lock_path).read_text())
    return bool(runtime), bool(build)


def lock_has_requirements(lock_path: Path) -> bool:
    for line in Path(lock_path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("--hash") and not line.startswith("\\"):
            return True
    return False


def render_dockerfile(pins, sources: ResolvedSources | None, acceptance: bool = True, deps: bool | None = None) -> str:
    """The Dockerfile text; with sources None the tree and created labels read "unresolved"
    (a review render of pins whose repositories are not reachable; never built)."""
    runtime_deps, build_deps = lock_parts(pins.lock_path())
    if deps is False:
        runtime_deps = build_deps = False
    if not BASE_RX.fullmatch(pins.base.image):
        raise BadInput(f"base.image: expected name@sha256:<64 hex>, got {pins.base.image!r}")
    comps = component_entries(pins, sources, (["/install/buildtools"] if build_deps else [])
                              + (["/install/deps"] if runtime_deps else []))
    prefixes = [("acceptance", "/install/acceptance")] if acceptance else []
    prefixes += ([("build", "/install/deps")] if runtime_deps else []) + [("build", c["prefix"]) for c in comps]
    data = {
        "builder_version": BUILDER_VERSION, "pins_name": pins.name, "base_image": pins.base.image,
        "python": pins.base.python_bin, "venv": venv_root(pins), "build_env": dict(pins.build.env),
        "source_date_epoch": SOURCE_DATE_EPOCH, "deps": runtime_deps, "build_deps": build_deps, "components": comps,
        "acceptance": acceptance, "prefixes": prefixes, "labels": labels(pins, sources),
    }
    dockerfile = environment().get_template(TEMPLATE).render(**data)
    problems = lint(dockerfile)
    if problems:
        raise BadInput(f"{TEMPLATES / TEMPLATE}: {problems[0]}")
    return dockerfile


def delivery_components(pins, sources: ResolvedSources, rendered_tag: str) -> dict:
    """What smoke.py and write_manifest.py check and record inside the image."""
    comps = {}
    for c in component_entries(pins, sources):
        comps[c["name"]] = {k: c[k] for k in ("commit", "tree", "pr", "url", "target", "distribution", "modules",
                                              "scm_version")}
    return {"components": comps, "base": {"image": pins.base.image, "name": pins.base.name,
                                          "digest": pins.base.digest},
            "builder_version": BUILDER_VERSION, "python": pins.base.python_bin, "tag": rendered_tag}


def render(pins, sources: ResolvedSources) -> RenderedBuild:
    """Render the Dockerfile and assemble the context tar (see builder/context.py)."""
    from builder import context

    acceptance = context.acceptance_dir() is not None
    deps = lock_has_requirements(pins.lock_path())
    dockerfile = render_dockerfile(pins, sources, acceptance=acceptance, deps=deps)
    dockerfile_sha = hashlib.sha256(dockerfile.encode()).hexdigest()
    tag = image_ref(pins)
    path, context_sha = context.assemble(pins, sources, dockerfile, dockerfile_sha,
                                         delivery_components(pins, sources, tag), acceptance=acceptance)
    return RenderedBuild(dockerfile=dockerfile, dockerfile_sha256=dockerfile_sha, context_path=str(path),
                         context_sha256=context_sha, labels=labels(pins, sources), tag=tag)


FROM_RX = re.compile(r"FROM [a-z0-9][a-z0-9.:/_-]*@sha256:[0-9a-f]{64} AS [a-z]+")
NETWORK_RX = re.compile(r"https?://|ftp://|\bgit (clone|fetch|pull)\b|\bcurl\b|\bwget\b|\bpip download\b")


def lint(dockerfile: str) -> list[str]:
    """What the unified Dockerfile must never contain: ADD, RUN --mount, shell-form RUN,
    a FROM without digest, or anything that reaches the network."""
    problems, stages = [], set()
    for group, text in instructions(dockerfile):
        word = text.split(" ", 1)[0].upper()
        if word == "ADD":
            problems.append(f"ADD is not used (COPY from the tool's context only): {text[:80]}")
        if "--mount" in text:
            problems.append(f"no RUN --mount (sources come from the context): {text[:80]}")
        if word == "RUN" and not text[4:].lstrip().startswith("["):
            problems.append(f"RUN must be exec form: {text[:80]}")
        if word == "FROM":
            parts = text.split()
            if not (FROM_RX.fullmatch(text) or (len(parts) == 4 and parts[1] in stages and parts[2] == "AS")):
                problems.append(f"FROM must name the base by digest or an earlier stage: {text[:80]}")
            stages.add(parts[-1])
        if word != "LABEL" and NETWORK_RX.search(text):
            problems.append(f"no network access in the build: {text[:80]}")
    return problems


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(stage group, instruction) per build step, in the order the classic builder numbers them;
    the group comes from the `# stage: <name>` comment above."""
    steps, group, current = [], "prepare", ""
    for line in dockerfile.splitlines():
        stripped = line.strip()
        if not current and stripped.startswith("#"):
            if stripped.startswith("# stage:"):
                group = stripped.split(":", 1)[1].strip()
            continue
        if not stripped and not current:
            continue
        current += (" " if current else "") + stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            steps.append((group, current))
            current = ""
    return steps
