"""One error type per outcome, each with its exit code (like cibuildwheel's errors module)."""


class BuilderError(Exception):
    """Base error; the message is one line naming the file or field and what was expected."""

    exit_code = 1

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split("\n")))


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
