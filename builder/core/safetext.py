"""Show untrusted text in a one-line message: escaped, and elided when long.

`show(value)` is what an error line prints for a value read from an input file: non-printable and
format characters are escaped (\\x85, \\u2028, \\u202e), long values keep their head and say how long
they were. `clip(line)` bounds a whole message (MAX_LINE characters).
"""
from __future__ import annotations

import unicodedata
from typing import Any

MAX_LINE = 300
MAX_SHOWN = 60


def escape(text: str, backslash: bool = True) -> str:
    """Printable characters stay; control, format and separator characters become \\x / \\u escapes."""
    out = []
    for ch in text:
        if ch == "\\" and backslash:
            out.append("\\\\")
        elif ch.isprintable() and unicodedata.category(ch)[0] not in "CZ" or ch == " ":
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def show(value: Any, limit: int = MAX_SHOWN) -> str:
    """A quoted, escaped, elided form of `value` for an error line."""
    if isinstance(value, str):
        head = value[:limit]
        text = "'" + escape(head) + "'"
        return text if len(value) <= limit else f"{text}... ({len(value)} characters)"
    if isinstance(value, (list, dict, tuple, set)):
        kind = type(value).__name__
        text = escape(repr(value)[: limit * 2])
        return text if len(text) <= limit else f"{text[:limit]}... (a {kind} of {len(value)})"
    return escape(repr(value))[:limit]


def clip(line: str, limit: int = MAX_LINE) -> str:
    """Escape a whole message and cut it to `limit` characters."""
    text = escape(" ".join(str(line).split("\n")), backslash=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."
