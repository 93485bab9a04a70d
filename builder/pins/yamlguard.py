"""Bounded, strict YAML: every limit is checked on the event stream before a tree is built.

`load_text(text, label)` refuses, with one line naming the field:
- characters of categories Cc (but tab, LF, CR), Cf (bidi overrides, zero-width), Zl, Zp and NEL
  anywhere in the file as written (before YAML folds U+0085 into a space) or in a value after escapes;
- nesting deeper than MAX_DEPTH, more than MAX_NODES nodes, a scalar longer than MAX_SCALAR,
  more than MAX_EXPANDED nodes once aliases are expanded (alias bombs);
- duplicate keys (one pass, aliases never walked again), non-scalar keys, merge keys (`<<`) and
  tags other than YAML's core ones.
The file size cap (MAX_BYTES) is applied by the caller before reading (builder.pins.inputfile).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from builder.core.errors import BadInput
from builder.core.safetext import escape, show

MAX_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_NODES = 5_000
MAX_SCALAR = 2_048
MAX_EXPANDED = 10_000
CORE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")} | {"!"}
_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_BIDI = {"\u061c", "\u200e", "\u200f"} | {chr(c) for c in range(0x202A, 0x202F)} | {chr(c) for c in range(0x2066, 0x206A)}

if TYPE_CHECKING:
    _Base = yaml.SafeLoader
else:
    _Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: linear and fast


class Loader(_Base):
    """Safe loader that also reads 1e-6 as a float (YAML 1.1 wants 1.0e-6), like Hydra does."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def forbidden(ch: str) -> bool:
    """A control, format, line/paragraph separator or bidi character (tab, LF and CR excepted)."""
    if ch in "\t\n\r":
        return False
    return ch in _BIDI or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def first_forbidden(text: str) -> int:
    """Index of the first forbidden character, or -1."""
    if text.isascii():
        found = _ASCII_CONTROL.search(text)
        return found.start() if found else -1
    bad = {ch for ch in set(text) if forbidden(ch)}
    if not bad:
        return -1
    return min(text.index(ch) for ch in bad)


def describe(ch: str) -> str:
    name = unicodedata.name(ch, "") or unicodedata.category(ch)
    return f"U+{ord(ch):04X} ({name})"


@dataclass
class _Frame:
    kind: str                       # "map" | "seq"
    path: str
    anchor: str | None
    size: int = 0                   # nodes below, aliases expanded
    keys: dict[str, int] = field(default_factory=dict)
    key: str | None = None          # map: the key whose value comes next
    index: int = 0                  # seq: next item


def _child(frame: _Frame | None) -> str:
    if frame is None:
        return ""
    if frame.kind == "seq":
        return f"{frame.path}[{frame.index}]"
    key = show(frame.key, 40)[1:-1] if frame.key is not None else "?"
    return f"{frame.path}.{key}" if frame.path else key


def _fail(where: str, text: str) -> BadInput:
    return BadInput(f"{where}: {text}" if where else text)


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}" if mark is not None else ""


class _Scanner:
    """One pass over the events; raises BadInput on the first limit or rule broken."""

    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.nodes = 0
        self.expanded = 0
        self.anchors: dict[str, int] = {}

    def run(self, text: str) -> None:
        for event in yaml.parse(text, Loader=Loader):
            self.event(event)

    def _count(self, size: int, where: str, mark: Any) -> None:
        self.expanded += size
        if self.expanded > MAX_EXPANDED:
            raise _fail(where, f"more than {MAX_EXPANDED} values once aliases are expanded ({_at(mark)});"
                        " refusing (alias bomb?)")
        if self.stack:
            self.stack[-1].size += size

    def _place(self, event: Any, is_scalar_key: bool) -> str:
        """Where the node of `event` goes; advance the parent; checks on keys."""
        top = self.stack[-1] if self.stack else None
        if top is None or top.kind == "seq":
            where = _child(top)
            if top is not None:
                top.index += 1
            return where
        if top.key is None:  # this node is a key
            if not is_scalar_key:
                raise _fail(top.path or "(top level)",
                            f"expected a plain string key, got {_kind(event)} ({_at(event.start_mark)})")
            key = event.value
            if key == "<<" and event.implicit[0]:
                raise _fail(top.path or "(top level)", f"merge keys (<<) are not allowed ({_at(event.start_mark)})")
            top.key = key
            where = _child(top)
            line = event.start_mark.line + 1
            if key in top.keys:
                raise _fail(where, f"duplicate key (lines {top.keys[key]} and {line})")
            top.keys[key] = line
            return where
        where = _child(top)
        top.key = None
        return where

    def event(self, event: Any) -> None:
        if isinstance(event, (yaml.StreamStartEvent, yaml.StreamEndEvent, yaml.DocumentEndEvent)):
            return
        if isinstance(event, yaml.DocumentStartEvent):
            if self.nodes:
                raise _fail("", f"expected one YAML document, found another ({_at(event.start_mark)})")
            return
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            done = self.stack.pop()
            if done.anchor:
                self.anchors[done.anchor] = done.size + 1
            if self.stack:
                self.stack[-1].size += done.size
            return
        is_key = bool(self.stack) and self.stack[-1].kind == "map" and self.stack[-1].key is None
        where = self._place(event, isinstance(event, yaml.ScalarEvent))
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _fail(where, f"more than {MAX_NODES} keys and values in the file; refusing")
        if isinstance(event, yaml.AliasEvent):
            self._count(self.anchors.get(event.anchor or "", 1), where, event.start_mark)
            return
        tag = getattr(event, "tag", None)
        if tag and tag not in CORE_TAGS:
            raise _fail(where, f"expected no YAML tag, got {show(tag)} ({_at(event.start_mark)})")
        if isinstance(event, yaml.ScalarEvent):
            self._scalar(event, where, is_key)
            return
        if len(self.stack) >= MAX_DEPTH:
            raise _fail(where, f"nested more than {MAX_DEPTH} levels deep ({_at(event.start_mark)}); refusing")
        self._count(1, where, event.start_mark)
        kind = "map" if isinstance(event, yaml.MappingStartEvent) else "seq"
        self.stack.append(_Frame(kind, where, event.anchor))

    def _scalar(self, event: Any, where: str, is_key: bool) -> None:
        value = event.value
        what = "key" if is_key else "value"
        if len(value) > MAX_SCALAR:
            raise _fail(where, f"a {what} of {len(value)} characters; at most {MAX_SCALAR} ({_at(event.start_mark)})")
        bad = first_forbidden(value)
        if bad >= 0:
            raise _fail(where, f"{what} {show(value)} holds {describe(value[bad])}; control and format "
                        "characters are not allowed")
        self._count(1, where, event.start_mark)
        if event.anchor:
            self.anchors[event.anchor] = 1


def _kind(event: Any) -> str:
    return {yaml.MappingStartEvent: "a mapping", yaml.SequenceStartEvent: "a list",
            yaml.AliasEvent: "an alias"}.get(type(event), "a value")


def _field_at(text: str, line: int, column: int) -> str:
    """Dotted field of the scalar covering (line, column), or '' (comment, or the file does not parse)."""
    scanner = _Scanner()
    try:
        for event in yaml.parse(text, Loader=Loader):
            if isinstance(event, yaml.ScalarEvent):
                top = scanner.stack[-1] if scanner.stack else None
                where = _child(top) if top is None or top.kind == "seq" or top.key is not None else \
                    _child(_Frame("map", top.path, None, key=event.value))
                start, end = event.start_mark, event.end_mark
                if start is None or end is None:
                    continue
                if (start.line, start.column) <= (line, column) < (end.line, end.column):
                    return where
                if (start.line, start.column) > (line, column):
                    return ""
            scanner.event(event)
    except (yaml.YAMLError, BadInput):
        return ""
    return ""


def check_raw(text: str) -> None:
    """Refuse a forbidden character anywhere in the file as written, naming its field when it is in one."""
    index = first_forbidden(text)
    if index < 0:
        return
    line = text.count("\n", 0, index)
    column = index - (text.rfind("\n", 0, index) + 1)
    # the scanner only sees what YAML makes of the text, so find the field on a copy without the character
    where = _field_at(text[:index] + "\ufffd" + text[index + 1:], line, column)
    where = where.replace("\ufffd", escape(text[index]))
    place = f"line {line + 1}, column {column + 1}"
    raise _fail(where, f"{describe(text[index])} at {place} (as written, before YAML folding);"
                " control and format characters are not allowed")


def load_text(text: str) -> Any:
    """Check the limits and rules above, then build the data (None for an empty document)."""
    check_raw(text)
    _Scanner().run(text)
    loader = Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
