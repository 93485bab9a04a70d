"""The state file (every step, so a killed bisect resumes) and the answer as JSON and Markdown."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.bisect.search import Step
from builder.core import files as fs
from builder.core.errors import BadInput

STATE = "bisect-state.json"


def load_state(path: Path, good: str, bad: str) -> dict[str, Step]:
    """The steps a killed bisect of the same GOOD and BAD made; BadInput for another bisect's state."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        if data.get("good") != good or data.get("bad") != bad:
            raise BadInput(f"{path}: a state file of another bisect (GOOD {data.get('good')}, BAD {data.get('bad')})")
        steps = [Step(**s) for s in data["steps"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{path}: expected a bisect state file ({type(exc).__name__})") from None
    return {s.key(): s for s in steps}


def save_state(path: Path, good: str, bad: str, run_id: str, steps: list[Step]) -> None:
    fs.write_atomic(path, json.dumps({"good": good, "bad": bad, "run_id": run_id,
                                      "steps": [s.as_dict() for s in steps]}, indent=1) + "\n")


def to_markdown(answer: dict[str, Any]) -> str:
    first = answer.get("first_bad")
    lines = ["# builder bisect", "", f"- GOOD: `{answer['good']}`", f"- BAD: `{answer['bad']}`"]
    lines += [f"- {n}" for n in answer.get("notes", [])]
    if first:
        lines += ["", f"## First bad commit: {first['component']} `{first['commit'][:12]}` (PR #{first['pr']})", "",
                  f"- {first['subject']} ({first['author']}, {first['repo']})",
                  f"- gate **{first['gate']}**: {first['reason']}",
                  f"- last good: `{answer['last_good']['commit'][:12]}` {answer['last_good']['subject']}"]
    elif answer.get("range"):
        lines += ["", "## First bad commit: one of " + ", ".join(f"`{c[:12]}`" for c in answer["range"])]
    for what in ("companion_pins", "replay"):
        if answer.get(what):
            lines.append(f"- {what.replace('_', ' ')}: `{answer[what]}`")
    if answer.get("other_differences"):
        lines += ["", "## Other differences (candidates of their own)", ""]
        lines += [f"- {d}" for d in answer["other_differences"]]
    lines += ["", f"## Steps ({answer['builds']} builds; bound {answer['bound']})", "",
              "| step | commits | verdict | build s | gate s | gate: reason |", "|---|---|---|---|---|---|"]
    for s in answer["steps"]:
        commits = " ".join(f"{n}={c[:8]}" for n, c in sorted(s["commits"].items()))
        why = f"{s['gate']}: {s['reason']}" if s["gate"] else ""
        lines.append(f"| {s['why']} | {commits} | {s['verdict']} | {s['build_s']:.1f} | {s['gate_s']:.1f} | "
                     f"{why.replace('|', '/')[:160]} |")
    return "\n".join(lines) + "\n"


def write(answer: dict[str, Any], out_dir: Path, json_path: Path | None) -> dict[str, Path]:
    text = json.dumps(answer, indent=2, sort_keys=True) + "\n"
    paths = {"json": out_dir / "bisect.json", "md": out_dir / "bisect.md"}
    fs.write_atomic(paths["json"], text)
    fs.write_atomic(paths["md"], to_markdown(answer))
    if json_path is not None:
        fs.write_atomic(json_path, text)
        paths["asked"] = json_path
    return paths
