"""One error hierarchy: every exit code of the tool comes from one of these classes, caught once in
the CLI's entry (`builder.cli.main`), like cibuildwheel's errors module.

    1 NotAccepted, BuildFailed, PublishError, AttestationError, StaleLock (`lock --check`)   2 BadInput
    3 InfraError
    4 Regression (nightly: accepted, a regression flag is up)   130 Interrupted (SIGINT / SIGTERM)

A usage error is 2 (`USAGE`); a fleet exits with the most severe of its runs' codes (`SEVERITY`, `severest`).
Registries (docs/registries.md): a refused credential or token (a wrong password, none, a pull-only token, a refused
renewal) is PublishError, 1; a certificate that does not verify, a host neither HTTPS nor named insecure, or no answer
is InfraError, 3.
"""
from __future__ import annotations

from typing import Any

from builder.core.safetext import MAX_LINE, keep_logs


class BuilderError(Exception):
    """Base error. The message is one line naming the file or field and what was expected;
    `details` (e.g. a build log's tail) are printed after it, one per line.  The line is kept within
    300 characters, long paths elided first (builder/core/safetext.py `fit`); a log path is kept whole, in `logs`
    (printed on its own line) when the line has no room for it."""

    exit_code = 1

    def __init__(self, message: str, details: list[str] | None = None):
        line, self.logs = keep_logs(" ".join(str(message).splitlines()), MAX_LINE - len("error: "))
        super().__init__(line)
        self.details = list(details or [])

    def headline(self) -> str:
        """The one line the CLI prints (stderr)."""
        return f"error: {self}"


class NotAccepted(BuilderError):
    exit_code = 1


class BuildFailed(BuilderError):
    exit_code = 1
    steps: tuple[Any, ...] = ()  # the engine's steps up to the failing one (completed ones keep their images)


class StaleLock(BuilderError):
    """`builder lock --check`: the lock no longer matches the pins (exit 1). render, build and run refuse
    the same lock as bad input (`as_bad_input`, exit 2)."""

    exit_code = 1

    def as_bad_input(self) -> BadInput:
        return BadInput(str(self))


class PublishError(BuilderError):
    exit_code = 1


class AttestationError(BuilderError):
    """A failed verification check; `check` names it (signature, subject, test result, ...)."""

    exit_code = 1

    def __init__(self, check: str, detail: str):
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.detail = detail

    def headline(self) -> str:
        return f"FAILED {self.check}: {self.detail}"


class BadInput(BuilderError):
    exit_code = 2


class InfraError(BuilderError):
    """Docker engine or registry unreachable, or a host tool missing."""

    exit_code = 3


class Regression(BuilderError):
    """Nightly: the image was accepted, but a regression flag is up against the last accepted run."""

    exit_code = 4


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) while a stage runs: a BaseException, so no `except Exception` swallows it;
    cleanup in `finally` blocks runs, then the CLI prints one line and exits 130."""

    exit_code = 130


USAGE = BadInput.exit_code  # a refused command line (unknown option, missing argument) is bad input
# Exit codes, most severe first: what a fleet of runs (`builder nightly A B ...`) exits with; any other code
# counts as 1.
SEVERITY = (Interrupted.exit_code, InfraError.exit_code, BadInput.exit_code, NotAccepted.exit_code,
            Regression.exit_code, 0)


def severest(codes: list[int]) -> int:
    """The most severe of several exit codes (SEVERITY); 0 for none."""
    rank = {c: i for i, c in enumerate(SEVERITY)}
    return min((c if c in rank else NotAccepted.exit_code for c in codes), key=lambda c: rank[c], default=0)
