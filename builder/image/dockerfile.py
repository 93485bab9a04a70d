"""Dockerfile text: the jinja2 environment and its quoting filters, the lint every render must pass,
and the parse of instructions into build steps (for per-stage timings)."""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import jinja2

from builder.core import resources
from builder.core.errors import BadInput
from builder.core.imageref import by_digest, hex_of
from builder.pins.allowlist import NETWORK_RX

TEMPLATE = "unified.Dockerfile.j2"
ENV_KEY_RX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNSAFE_RX = re.compile(r"[\x00-\x1f\x7f$\u0085\u2028\u2029]")


def dq(value: object) -> str:
    """JSON-quote a value for the Dockerfile; refuse newline/CR/control characters and `$`
    (defence in depth behind pins validation)."""
    text = str(value)
    if UNSAFE_RX.search(text):
        raise BadInput(f"Dockerfile value {text[:80]!r}: expected no newline, carriage return, control character or '$'")
    return json.dumps(text)


def argv(values: Iterable[object]) -> str:
    """An exec-form JSON array, each element through dq."""
    return "[" + ", ".join(dq(v) for v in values) + "]"


def labelpairs(mapping: Mapping[str, str]) -> str:
    """`"key"="value"` pairs of one LABEL instruction, sorted, one per continuation line."""
    return " \\\n      ".join(f"{dq(k)}={dq(v)}" for k, v in items(mapping))


def envkey(value: object) -> str:
    text = str(value)
    if not ENV_KEY_RX.fullmatch(text):
        raise BadInput(f"Dockerfile env name {text!r}: expected [A-Za-z_][A-Za-z0-9_]*")
    return text


def items(mapping: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Sorted items of a dict: templates never iterate a dict in insertion order."""
    return sorted(mapping.items())


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(resources.templates())), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(dq=dq, argv=argv, envkey=envkey, items=items, labelpairs=labelpairs)
    return env


STAGE_RX = re.compile(r"[a-z]+")
SEED_FROM = "FROM ${CCACHE_SEED} AS ccache"  # the compiler cache's side image (builder/image/ccache.py)


def pinned_base(ref: str) -> bool:
    """A FROM reference the unified Dockerfile may name: lowercase, by sha256 digest (the reference grammar of
    builder/core/imageref.py decides, not a regex of its own)."""
    image = by_digest(ref)
    if image is None or ref != ref.lower():
        return False
    try:
        hex_of(str(image.digest))
    except ValueError:
        return False
    return True


def lint(dockerfile: str) -> list[str]:
    """What the unified Dockerfile must never contain: ADD, RUN --mount, shell-form RUN,
    a FROM without digest (but the compiler cache seed's), or anything that reaches the network."""
    problems: list[str] = []
    stages: set[str] = set()
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
            named = len(parts) == 4 and parts[2] == "AS" and STAGE_RX.fullmatch(parts[3]) is not None
            earlier = named and parts[1] in stages
            if not ((named and pinned_base(parts[1])) or text == SEED_FROM or earlier):
                problems.append(f"FROM must name the base by digest or an earlier stage: {text[:80]}")
            stages.add(parts[-1])
        if word != "LABEL" and NETWORK_RX.search(text):
            problems.append(f"no network access in the build: {text[:80]}")
    return problems


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(stage group, instruction) per build step, in the order the classic builder numbers them;
    the group comes from the `# stage: <name>` comment above."""
    steps: list[tuple[str, str]] = []
    group, current = "prepare", ""
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


def render_text(data: dict[str, Any]) -> str:
    """The unified Dockerfile from its template; BadInput naming the template if the lint finds a problem."""
    dockerfile = environment().get_template(TEMPLATE).render(**data)
    problems = lint(dockerfile)
    if problems:
        raise BadInput(f"dockerfiles/{TEMPLATE}: {problems[0]}")
    return dockerfile
