"""Show untrusted text in a one-line message: escaped, and elided when long.

`show(value)` is what an error line prints for a value read from an input file: non-printable and
format characters are escaped (\\x85, \\u2028, \\u202e), long values keep their head and say how long
they were. `clip(line)` bounds a whole message (MAX_LINE characters); `fit(line)` does too, first
eliding the middle of long paths (head and file name kept) so that what is cut is least informative; a log
file's path is never elided (`keep_logs` puts it on its own line when the line has no room for it).
"""
from __future__ import annotations

import re
import unicodedata
from typing import Any

MAX_LINE = 300
MAX_SHOWN = 60
KEEP_PATH = 100  # a path of at most this many characters is never elided (the line is cut at its end instead)
MIN_PATH = 32  # nor is a longer one elided below this many
LEAD = 20  # a path starting within this many characters is the line's subject ('error: <file>: ...')
PATH = re.compile(r"[^\s'\"()\[\]{},;<>]*/[^\s'\"()\[\]{},;<>]*")
# a log file's path: never elided (a person pastes it); `keep_logs` moves it to its own line when the line is full
LOG = re.compile(r"[^\s'\"()\[\]{},;<>]*/[^\s'\"()\[\]{},;<>/]*\.log(?=$|[\s'\"()\[\]{},;<>:.])")
LOG_BELOW = "(path below)"


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


def elide(path: str, width: int) -> str:
    """`path` in at most `width` characters: its head, '...', and its tail (the file name) kept whole when it fits."""
    if len(path) <= width:
        return path
    width = max(width, 7)
    tail = path[-(width - 3) * 2 // 3:]
    cut = tail.find("/")
    if 0 < cut < len(tail) // 2:  # start the tail at a separator when that loses little
        tail = tail[cut:]
    head = path[: width - 3 - len(tail)]
    return f"{head}...{tail}"


def fit(line: str, limit: int = MAX_LINE) -> str:
    """A one-line message within `limit` characters, escaped.  Where it is longer: first its paths longer than
    KEEP_PATH, then also the shorter ones after the leading one (the file the line is about, named in full), are
    elided to one common width (the widest that fits, never below MIN_PATH); what still does not fit is cut."""
    text = escape(" ".join(str(line).split("\n")), backslash=False)
    if len(text) <= limit:
        return text
    logs = {m.group() for m in LOG.finditer(text)}
    found = [m for m in PATH.finditer(text) if len(m.group()) > MIN_PATH
             and not any(m.group().startswith(log) for log in logs)]
    lead = found[0].group() if found and found[0].start() <= LEAD else None
    long = {m.group() for m in found if len(m.group()) > KEEP_PATH}
    for paths in (long, long | {m.group() for m in found if m.group() != lead}):
        fitted = _shrink(text, sorted(paths, key=len, reverse=True), limit)
        if len(fitted) <= limit:
            return fitted
    return clip(fitted, limit)


def _shrink(text: str, paths: list[str], limit: int) -> str:
    """`text` with `paths` elided to the widest common width (>= MIN_PATH) at which it fits in `limit`."""

    def shrunk(width: int) -> str:
        out = text
        for path in paths:
            out = out.replace(path, elide(path, width))
        return out

    low, high = MIN_PATH, max((len(p) for p in paths), default=MIN_PATH)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if len(shrunk(mid)) <= limit else (low, mid - 1)
    return shrunk(low)


def keep_logs(line: str, limit: int = MAX_LINE) -> tuple[str, list[str]]:
    """`fit(line)` with its log paths whole; where they do not fit in the line, each is replaced by
    '(path below)' and returned, to be printed whole on a line of its own."""
    text = escape(" ".join(str(line).split("\n")), backslash=False)
    logs = list(dict.fromkeys(m.group() for m in LOG.finditer(text)))
    fitted = fit(text, limit)
    cut = fitted.endswith("...") and not text.endswith("...")  # fitting eliding paths was not enough
    if all(log in fitted for log in logs) and not cut:
        return fitted, []
    for log in logs:  # the logs go below, so the room they took stays for the rest (the reason)
        text = text.replace(log, LOG_BELOW)
    return fit(text, limit), logs
