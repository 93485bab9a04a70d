"""Notifications of `builder nightly`: when the verdict flips (against the previous night of the same pins
name) or a regression flag goes up, a Slack-compatible JSON message goes to the webhook URL
(BUILDER_NOTIFY_URL: an HTTP POST) and to the command (BUILDER_NOTIFY_COMMAND: the JSON on its stdin).

The message is `text` plus one attachment whose `fields` hold the digest, the PRs, the gate and the history
page's path (Slack's and Mattermost's incoming webhooks take this shape). A webhook or command that fails or
times out never changes the nightly's verdict or exit code: each target logs exactly one line, sent or not.
The log names the webhook by its scheme and host only (a Slack webhook's path is its secret).
"""
from __future__ import annotations

import json
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from builder.core import log
from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.core.records import Report
from builder.nightly.history import History, Run
from builder.report import document

SEND_TIMEOUT_S = 10.0
FAILING = ("fail", "inconclusive")
COLOURS = {"ACCEPTED": "#1a7f37", "NOT ACCEPTED": "#cf222e", "flag": "#bf8700"}


def event(previous: Run | None, verdict: str, flag: bool) -> str | None:
    """Why to notify, or None: the verdict flipped since the previous night, or the regression flag went up."""
    if previous is not None and previous.verdict != verdict:
        return f"verdict flipped: {previous.verdict} -> {verdict}"
    if flag and not (previous is not None and previous.regression):
        return "regression flag up"
    return None


def gate_line(report: Report, previous: Report | None, reasons: list[str]) -> str:
    """The gates behind the event: those failing now, else those fixed since the previous night, else the
    regression reasons."""
    failing = [f"{g.name}: {g.status}: {g.reason}" for g in report.gates if g.status in FAILING]
    if failing:
        return "; ".join(failing)[:500]
    before = {g.name: g.status for g in previous.gates} if previous else {}
    fixed = [f"{g.name}: fixed" for g in report.gates if g.status == "pass" and before.get(g.name) in FAILING]
    return "; ".join(fixed or reasons or ["-"])[:500]


def payload(report: Report, why: str, digest: str | None, gate: str, page: Path | None,
            first_bad: str = "") -> dict[str, Any]:
    colour = COLOURS["flag"] if why.startswith("regression") else COLOURS[report.verdict]
    prs = ", ".join(f"{n} #{c.pr} {c.commit[:12]}" for n, c in report.sources.components.items())
    fields = [("digest", digest or report.image_id), ("PRs", prs), ("gate", gate), ("page", str(page or "-"))]
    fields += [("first bad commit", first_bad)] if first_bad else []  # named by `nightly --bisect`
    return {"text": f"nightly {report.name}: {report.verdict}: {why}",
            "attachments": [{"color": colour, "fallback": f"nightly {report.name}: {why}",
                             "fields": [{"title": t, "value": v, "short": t == "digest"} for t, v in fields]}]}


def where(url: str) -> str:
    """The webhook as the log may name it: scheme and host, never the path or query (its secret)."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}/..."  # no user info either


def post(url: str, message: dict[str, Any], timeout: float = SEND_TIMEOUT_S) -> str:
    """POST the message within `timeout` seconds in all: connecting, sending and every read together (requests'
    own timeout bounds each socket operation only, so a server trickling its answer a byte at a time would hold
    the nightly forever). The send runs in a daemon thread; past the deadline it is left to its own per-operation
    timeout. The one line to log (never raises)."""
    answer: list[str] = []
    sender = threading.Thread(target=lambda: answer.append(_send(url, message, timeout)), daemon=True,
                              name="notify-webhook")
    sender.start()
    sender.join(timeout)
    if not answer:
        return f"notify: webhook {where(url)} not sent (no answer within {timeout:g} s); verdict and exit code stand"
    return answer[0]


def _send(url: str, message: dict[str, Any], timeout: float) -> str:
    try:
        response = requests.post(url, json=message, timeout=timeout)
    except requests.RequestException as exc:
        return f"notify: webhook {where(url)} not sent ({type(exc).__name__}); verdict and exit code stand"
    if not 200 <= response.status_code < 300:
        return f"notify: webhook {where(url)} answered HTTP {response.status_code}; verdict and exit code stand"
    return f"notify: webhook {where(url)} sent (HTTP {response.status_code})"


def run_command(command: str, message: dict[str, Any], timeout: float = SEND_TIMEOUT_S) -> str:
    """Run the command (split like a shell would, no shell) with the message on its stdin; the one line to log."""
    argv = shlex.split(command)
    try:
        done = subprocess.run(argv, input=json.dumps(message).encode(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"notify: command {argv[0]} timed out after {timeout:g} s; verdict and exit code stand"
    except OSError as exc:
        return f"notify: command {argv[0]} did not start ({exc.strerror}); verdict and exit code stand"
    if done.returncode != 0:
        return f"notify: command {argv[0]} exited {done.returncode}; verdict and exit code stand"
    return f"notify: command {argv[0]} ran"


def notify(settings: Settings, previous: Run | None, previous_report: Report | None, report: Report, flag: bool,
           reasons: list[str], digest: str | None, page: Path | None, timeout: float = SEND_TIMEOUT_S,
           first_bad: str = "") -> list[str]:
    """Send the message to each configured target when there is an event; the lines logged (one per target)."""
    why = event(previous, report.verdict, flag)
    if why is None or not (settings.notify_url or settings.notify_command):
        return []
    message = payload(report, why, digest, gate_line(report, previous_report, reasons), page, first_bad)
    lines = []
    if settings.notify_url:
        lines.append(post(settings.notify_url, message, timeout))
    if settings.notify_command:
        lines.append(run_command(settings.notify_command, message, timeout))
    for line in lines:
        log.info(line)
    return lines


def notify_night(history: History, report: Report, report_json: Path, settings: Settings, flag: bool,
                 reasons: list[str], digest: str | None, page: Path | None, first_bad: str = "") -> list[str]:
    """After a nightly's row: the message when the verdict flipped against the run before it in the history, or a
    regression flag went up (`notify`); a notification that fails never changes the nightly's verdict."""
    rows = history.runs(report.name)
    mine = max((i for i, r in enumerate(rows) if r.report_path == str(report_json)), default=len(rows))
    previous = rows[mine - 1] if mine > 0 else None
    try:
        before = document.load(previous.report_path) if previous else None
    except BadInput:
        before = None  # its report is gone: the message names no fixed gate
    return notify(settings, previous, before, report, flag, reasons, digest, page, first_bad=first_bad)
