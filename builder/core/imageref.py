"""Image references as the distribution project's reference grammar defines them, plus its limits.

    reference        := name [ ":" tag ] [ "@" digest ]
    name             := [domain "/"] path-component ["/" path-component]*     (at most 255 characters)
    domain           := host [":" port]                                       (port 1..65535 here)
    host             := domain-component ["." domain-component]* | "[" ipv6 "]"
    domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
    path-component   := [a-z0-9]+ (separator [a-z0-9]+)*,  separator := [._] | "__" | "-"+
    tag              := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest           := algorithm ":" hex; the pins ask for sha256 and 64 lowercase hex digits

The first component is a domain when it holds "." or ":", is "localhost", or has an upper-case letter.
`parse` says which part is wrong (a host label ending in "-", "x..y", port 99999, a long name).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from builder.core.safetext import show

NAME_MAX = 255
PORT_MAX = 65535
ALNUM = r"[a-z0-9]+"
SEPARATOR = r"(?:[._]|__|[-]+)"
PATH_COMPONENT = rf"{ALNUM}(?:{SEPARATOR}{ALNUM})*"
DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
HOST = rf"(?:{DOMAIN_COMPONENT}(?:\.{DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
DOMAIN = rf"{HOST}(?::[0-9]+)?"
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
SHA256 = r"sha256:[0-9a-f]{64}"
NAME = rf"(?:{DOMAIN}/)?{PATH_COMPONENT}(?:/{PATH_COMPONENT})*"
REFERENCE = rf"({NAME})(?::({TAG}))?(?:@({DIGEST}))?"


@dataclass(frozen=True)
class Reference:
    domain: str          # "" when the reference names none
    path: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path


def _is_domain(first: str) -> bool:
    return "." in first or ":" in first or first == "localhost" or first != first.lower() or first.startswith("[")


def _check_domain(domain: str) -> None:
    if domain.startswith("["):
        host, _, port = domain.rpartition("]:") if "]:" in domain else (domain, "", "")
        host = host + "]" if port else host
        if not re.fullmatch(r"\[[a-fA-F0-9:]+\]", host):
            raise ValueError(f"registry host {show(host)} is not a bracketed IPv6 address")
    else:
        host, _, port = domain.partition(":")
        for label in host.split("."):
            if not re.fullmatch(DOMAIN_COMPONENT, label):
                why = "an empty label" if not label else (
                    f"label {show(label)} starts or ends with '-'" if label[0] == "-" or label[-1] == "-"
                    else f"label {show(label)} has characters other than letters, digits and '-'")
                raise ValueError(f"registry host {show(host)}: {why}")
    if ":" in domain and not domain.endswith("]"):
        if not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= PORT_MAX:
            raise ValueError(f"registry port {show(port)} is not a number in 1..{PORT_MAX}")


def parse(ref: str, *, need_domain: bool = False, allow_tag: bool = True, need_digest: bool = False,
          allow_digest: bool = True) -> Reference:
    """Split and check `ref`; ValueError saying which part breaks the grammar or a limit."""
    if not isinstance(ref, str) or not ref:
        raise ValueError(f"expected an image reference, got {show(ref)}")
    name_tag, at, digest = ref.partition("@")
    last_slash = name_tag.rfind("/")
    name, colon, tag = (name_tag.rpartition(":") if name_tag.rfind(":") > last_slash
                        else (name_tag, "", ""))
    first, slash, rest = name.partition("/")
    domain, path = (first, rest) if slash and _is_domain(first) else ("", name)
    if domain:
        _check_domain(domain)
    elif need_domain:
        raise ValueError("expected a registry host first (like '127.0.0.1:5000/' or 'docker.io/')")
    for part in path.split("/"):
        if not re.fullmatch(PATH_COMPONENT, part):
            raise ValueError(f"path component {show(part)} is not lowercase letters and digits joined by"
                             " '.', '_', '__' or '-' (no leading, trailing or doubled '.')")
    if len(name) > NAME_MAX:
        raise ValueError(f"repository name of {len(name)} characters; at most {NAME_MAX}")
    if colon and not allow_tag:
        raise ValueError(f"expected no tag here, got {show(tag)}")
    if colon and not re.fullmatch(TAG, tag):
        raise ValueError(f"tag {show(tag)} is not [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}")
    if at and not re.fullmatch(SHA256, digest):
        raise ValueError(f"digest {show(digest)} is not sha256:<64 lowercase hex>")
    if at and not allow_digest:
        raise ValueError(f"expected no digest here, got {show(digest)}")
    if need_digest and not at:
        raise ValueError("expected @sha256:<64 lowercase hex> (a digest; tags alone move)")
    if not re.fullmatch(REFERENCE, ref):  # the grammar is the authority; the checks above explain it
        raise ValueError(f"{show(ref)} is not an image reference")
    return Reference(domain, path, tag if colon else None, digest if at else None)


def check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not re.fullmatch(TAG, tag):
        raise ValueError(f"expected an image tag of [A-Za-z0-9_.-] (first not '.' or '-'), at most 128"
                         f" characters, got {show(tag)}")
    return tag


def text_schema(parse: Callable[[str], str]) -> Any:
    """A record field of a parsed-text value: validated from a string by `parse`, written back as the string."""
    from pydantic_core import core_schema  # lazy: only records need it

    return core_schema.no_info_after_validator_function(
        parse, core_schema.str_schema(), serialization=core_schema.plain_serializer_function_ser_schema(str))


class ImageRef(str):
    """One image reference, parsed once by the grammar above: registry, repository, tag, digest.

    It is the string it was parsed from (`str()` round-trips, JSON and comparisons see plain text), with
    the parts as attributes; records and registry calls take it instead of splitting strings."""

    registry: str       # "" when the reference names none
    repository: str     # path inside the registry
    tag: str | None
    digest: str | None

    def __new__(cls, text: str, *, need_domain: bool = False, need_digest: bool = False) -> ImageRef:
        parts = parse(text, need_domain=need_domain, need_digest=need_digest)
        ref = super().__new__(cls, text)
        ref.registry, ref.repository, ref.tag, ref.digest = parts.domain, parts.path, parts.tag, parts.digest
        return ref

    @classmethod
    def of(cls, registry: str, repository: str, tag: str | None = None, digest: str | None = None) -> ImageRef:
        text = f"{registry}/{repository}" if registry else repository
        return cls(text + (f":{tag}" if tag else "") + (f"@{digest}" if digest else ""))

    @property
    def name(self) -> str:
        """registry/repository, without tag or digest."""
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    def at(self, digest: str) -> ImageRef:
        """The same repository by digest (no tag)."""
        return ImageRef.of(self.registry, self.repository, digest=digest)

    def tagged(self, tag: str) -> ImageRef:
        return ImageRef.of(self.registry, self.repository, tag=tag)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return text_schema(lambda value: value if isinstance(value, ImageRef) else cls(value))


HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")  # Docker Hub's names for itself


class Repository(str):
    """A repository with its registry host (`host[:port]/path`, no tag or digest), parsed once where it enters: the
    pins, a report, an image's label. `host`, and `path` as the registry's API names it (Docker Hub's bare names are
    `library/<name>`); it is the string it was parsed from, like ImageRef. ValueError names what breaks."""

    host: str
    path: str

    def __new__(cls, text: str) -> Repository:
        parts = parse(text, need_domain=True, allow_tag=False, allow_digest=False)
        repo = super().__new__(cls, text)
        hub_bare = parts.domain in HUB_HOSTS and "/" not in parts.path
        repo.host, repo.path = parts.domain, f"library/{parts.path}" if hub_bare else parts.path
        return repo

    @classmethod
    def of(cls, ref: ImageRef) -> Repository:
        """The repository of a reference that names its registry (tag and digest dropped)."""
        return cls(ref.name)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return text_schema(lambda value: value if isinstance(value, Repository) else cls(value))


class _Hasher(Protocol):
    def hexdigest(self) -> str: ...


def digest_of(data: bytes | _Hasher) -> str:
    """`sha256:<hex>` of bytes, or of a sha256 hasher fed already (the one place that spells the prefix)."""
    hasher = hashlib.sha256(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    return f"sha256:{hasher.hexdigest()}"


def split_digest(digest: str) -> tuple[str, str]:
    """(algorithm, hex) of `<algorithm>:<hex>`; ("", text) when there is no algorithm."""
    algo, sep, hexpart = digest.partition(":")
    return (algo, hexpart) if sep else ("", digest)


def by_digest(text: str) -> ImageRef | None:
    """The reference when `text` is one that names a digest (REPOSITORY@sha256:...), else None (an image ID,
    a tag, or not a reference)."""
    try:
        ref = ImageRef(text)
    except ValueError:
        return None
    return ref if ref.digest else None


def hex_of(digest: str) -> str:
    """The hex part of `sha256:<hex>` (ValueError for anything else)."""
    algo, sep, hexpart = digest.partition(":")
    if algo != "sha256" or not sep or not re.fullmatch(r"[0-9a-f]{64}", hexpart):
        raise ValueError(f"expected sha256:<64 lowercase hex>, got {show(digest)}")
    return hexpart
