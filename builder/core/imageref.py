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

import re
from dataclasses import dataclass

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
