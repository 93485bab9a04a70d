"""One error type per outcome, each with its exit code (like cibuildwheel's errors module)."""
from __future__ import annotations


class BuilderError(Exception):
    """Base error. The message is one line naming the file or field and what was expected;
    `details` (e.g. a build log's tail) are printed after it, one per line."""

    exit_code = 1

    def __init__(self, message: str, details: list[str] | None = None):
        super().__init__(" ".join(str(message).splitlines()))
        self.details = list(details or [])


class NotAccepted(BuilderError):
    exit_code = 1


class BuildFailed(BuilderError):
    exit_code = 1


class PublishError(BuilderError):
    exit_code = 1


class BadInput(BuilderError):
    exit_code = 2


class InfraError(BuilderError):
    """Docker engine or registry unreachable, or a host tool missing."""

    exit_code = 3


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) while a stage runs: a BaseException, so no `except Exception` swallows it;
    cleanup in `finally` blocks runs, then the CLI prints one line and exits 130."""

    exit_code = 130
