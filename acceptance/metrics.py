"""Parse verl-format training logs: the file logger's JSONL and the console `step:N - key:value` lines."""
import json
import math
import re
from collections.abc import Sequence
from typing import Any

STEP_LINE = re.compile(r"^\s*(?:\S.*?\s)?step:(\d+)(?: - |$)")
ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b(?::|$)")


def _value(text: str) -> float | str:
    """A console value: a number when it parses as one (nan/inf included), else the raw string."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return text


def parse_jsonl(text: str) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """{step: data} from `{"step": N, "data": {...}}` lines; later lines for a step update earlier ones."""
    steps: dict[int, dict[str, Any]] = {}
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)  # json accepts NaN / Infinity as Python writes them
            step, data = int(row["step"]), row["data"]
            if not isinstance(data, dict):
                raise TypeError("data is not an object")
        except (ValueError, KeyError, TypeError) as err:
            problems.append(f"line {number}: {err}")
            continue
        steps.setdefault(step, {}).update(data)
    return steps, problems


def parse_console(text: str) -> dict[int, dict[str, Any]]:
    """{step: metrics} from console lines split on ' - ' (as verl's check_results.py does)."""
    steps: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        match = STEP_LINE.match(line)
        if not match:
            continue
        parts = line[match.start(1) - len("step:"):].strip().split(" - ")
        data: dict[str, float | str] = {}
        for part in parts[1:]:
            key, sep, value = part.partition(":")
            if sep:
                data[key.strip()] = _value(value)
        steps.setdefault(int(match.group(1)), {}).update(data)
    return steps


def number(value: object) -> float | None:
    """The float of a logged value, or None when it is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def is_finite(value: object) -> bool:
    num = number(value)
    return num is not None and math.isfinite(num)


def disagreements(file_steps: dict[int, dict[str, Any]], console_steps: dict[int, dict[str, Any]],
                  keys: Sequence[str]) -> list[str]:
    """Metrics both logs carry for a step where one says exactly 0 and the other does not
    (console values may be rounded, so only the zero / non-zero / NaN class is compared)."""
    def kind(value: object) -> str:
        num = number(value)
        return "nan" if num is None or math.isnan(num) else ("zero" if num == 0.0 else "nonzero")

    out = []
    for step in sorted(set(file_steps) & set(console_steps)):
        for key in keys:
            a, b = file_steps[step].get(key), console_steps[step].get(key)
            if a is not None and b is not None and kind(a) != kind(b):
                out.append(f"step {step} {key}: file {a!r} vs console {b!r}")
    return out


def merged(file_steps: dict[int, dict[str, Any]],
           console_steps: dict[int, dict[str, Any]]) -> tuple[dict[int, dict[str, Any]], str]:
    """The file log when it has any step, else the console lines; and which one was used."""
    if file_steps:
        return file_steps, "file"
    if console_steps:
        return console_steps, "console"
    return {}, "none"


def first_nonfinite(steps: dict[int, dict[str, Any]], limit: int = 5) -> str | None:
    """'step N: key = nan, key2 = inf' for the first step that logged a NaN or an infinity (its non-finite keys
    in logged order, at most `limit`), else None."""
    for step in sorted(steps):
        values = [(key, number(value)) for key, value in steps[step].items()]
        bad = [(key, value) for key, value in values if value is not None and not math.isfinite(value)]
        if bad:
            shown = ", ".join(f"{key} = {number(value)!r}" for key, value in bad[:limit])
            more = f" (+{len(bad) - limit} more)" if len(bad) > limit else ""
            return f"step {step}: {shown}{more}"
    return None


def last_error(console: str) -> str | None:
    """The recipe's last error line: the last `SomeError: ...` line (a Python traceback's end), else the
    last non-empty line after a 'Traceback' header, else None."""
    lines = [line.strip() for line in console.splitlines() if line.strip()]
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return line[:300]
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        return lines[-1][:300]
    return None
