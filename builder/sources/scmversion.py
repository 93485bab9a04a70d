"""Versions from VCS metadata, computed from the mirror (exported trees have no .git).

A component whose pyproject.toml at the pinned commit uses setuptools-scm or hatch-vcs gets
its version from the nearest tag, the distance and the commit (pygit2 `describe`, like
`git describe --tags --long --match *[0-9]*`), formatted by setuptools-scm itself with the
component's own [tool.setuptools_scm] / [tool.hatch.version.raw-options] settings. The build
gets it as SETUPTOOLS_SCM_PRETEND_VERSION_FOR_<DIST> (hatch-vcs reads it too).
"""
from __future__ import annotations

import re
import tomllib
import warnings
from typing import Any

import pygit2
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.errors import BadInput

SCM_BACKENDS = ("setuptools-scm", "setuptools_scm", "hatch-vcs", "hatch_vcs")
VERSIONEER = "versioneer"
TAG_PATTERN = "*[0-9]*"


def pyproject_at(repo: pygit2.Repository, commit: str) -> dict[str, Any] | None:
    """pyproject.toml of a commit, parsed; None when the commit has none."""
    tree = repo[commit].peel(pygit2.Commit).tree
    if "pyproject.toml" not in tree:
        return None
    blob = repo[tree["pyproject.toml"].id].peel(pygit2.Blob)
    try:
        return tomllib.loads(blob.data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"{commit[:12]}:pyproject.toml: expected valid TOML ({exc})") from None


def _req_name(requirement: str) -> str:
    return canonicalize_name(re.split(r"[\s\[<>=!~;@(]", requirement.strip(), maxsplit=1)[0])


def scm_settings(pyproject: dict[str, Any] | None) -> dict[str, Any] | None:
    """The setuptools-scm settings when the version comes from VCS metadata, else None."""
    if not pyproject:
        return None
    tool = pyproject.get("tool", {})
    requires = {_req_name(r) for r in pyproject.get("build-system", {}).get("requires", [])}
    hatch = tool.get("hatch", {}).get("version", {})
    if hatch.get("source") == "vcs":
        return dict(hatch.get("raw-options", {}))
    if "setuptools_scm" in tool or "setuptools-scm" in requires:
        return dict(tool.get("setuptools_scm", {}))
    if VERSIONEER in requires or "versioneer" in tool:
        raise BadInput("pyproject.toml: versioneer versions from git are not supported "
                       "(expected setuptools-scm or hatch-vcs, or a static version)")
    return None


def pretend_env_name(distribution: str) -> str:
    """SETUPTOOLS_SCM_PRETEND_VERSION_FOR_<DIST> as setuptools-scm spells it."""
    return "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_" + re.sub(r"[-.]", "_", canonicalize_name(distribution)).upper()


def pretend_env(distribution: str, version: str) -> dict[str, str]:
    """The build env that hands the version in: the per-distribution name, and the plain
    SETUPTOOLS_SCM_PRETEND_VERSION for a setup.py that calls setuptools_scm.get_version() without
    a dist name (vLLM does); each component builds in its own step, so the plain one is its own."""
    return {pretend_env_name(distribution): version, "SETUPTOOLS_SCM_PRETEND_VERSION": version}


def same_version(built: str, scm: str) -> bool:
    """The built version is the VCS version, or it with a local label a setup.py appends
    (vLLM: 0.33.1.dev1+g9752642941 -> 0.33.1.dev1+g9752642941.cpu)."""
    return built == scm or built.startswith(scm + ("." if "+" in scm else "+"))


def checked(version: str) -> str:
    """A version for the build env: PEP 440 and nothing a Dockerfile could misread."""
    try:
        Version(version)
    except InvalidVersion:
        raise BadInput(f"VCS version {version!r}: expected a PEP 440 version") from None
    if not re.fullmatch(r"[0-9A-Za-z.+!-]{1,64}", version):
        raise BadInput(f"VCS version {version!r}: expected only [0-9A-Za-z.+!-]")
    return version


def describe(repo: pygit2.Repository, commit: str) -> tuple[str, int, str]:
    """(nearest tag, distance, 'g' + abbreviated commit); tag '0.0' and the commit count without a tag."""
    oid = repo[commit].peel(pygit2.Commit).id
    try:
        text = repo.describe(committish=str(oid), describe_strategy=pygit2.enums.DescribeStrategy.TAGS,
                             pattern=TAG_PATTERN, always_use_long_format=True)
    except (KeyError, pygit2.GitError):
        count = sum(1 for _ in repo.walk(oid))
        return "0.0", count, f"g{repo[oid].short_id}"
    tag, distance, node = text.rsplit("-", 2)
    return tag, int(distance), node


def version_at(repo: pygit2.Repository, commit: str, settings: dict[str, Any]) -> str:
    """The version setuptools-scm would compute on a clean checkout of commit."""
    from setuptools_scm import Configuration  # lazy: only when a version is computed
    from setuptools_scm.version import format_version, meta  # lazy: only when a version is computed

    tag, distance, node = describe(repo, commit)
    keep = {k: v for k, v in settings.items() if k in ("version_scheme", "local_scheme", "tag_regex",
                                                          "normalize", "fallback_version")}
    with warnings.catch_warnings():  # vcs-versioning asks for a VcsEnvironment; the defaults are what we want
        warnings.simplefilter("ignore", DeprecationWarning)
        config = Configuration.from_data(relative_to="pyproject.toml", data=keep)
        text = format_version(meta(tag, distance=distance, node=node, dirty=False, config=config))
    try:
        Version(text)
    except InvalidVersion:
        raise BadInput(f"{commit[:12]}: tag {tag!r} gives version {text!r}, expected a PEP 440 version") from None
    return text


def component_version(repo: pygit2.Repository, commit: str) -> str:
    """The VCS version of the commit, or '' when its version does not come from VCS metadata."""
    settings = scm_settings(pyproject_at(repo, commit))
    return "" if settings is None else version_at(repo, commit, settings)
