"""Usage errors of the command line as one line: `error: <what>; see '<command> --help'`, exit 2 (errors.USAGE)."""
from __future__ import annotations

import sys

import typer

from builder.core.errors import USAGE, Interrupted
from builder.core.safetext import fit


def run_app(app: typer.Typer, argv: list[str] | None = None) -> int:
    """Run the typer app without click's standalone handling; return the exit code."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="builder", standalone_mode=False)
    except typer.Exit as exc:  # typer turns SIGINT / SIGTERM (Interrupted, a KeyboardInterrupt) into Exit(130)
        if isinstance(exc.__cause__, KeyboardInterrupt):
            interrupted(exc.__cause__)
        return exc.exit_code
    except typer.Abort as exc:
        interrupted(exc.__cause__)
        return Interrupted.exit_code
    except typer.TyperException as exc:  # click's UsageError family, vendored by typer
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            print(ctx.get_help(), file=sys.stderr)
            return USAGE
        message = (exc.format_message() if hasattr(exc, "format_message") else str(exc)).rstrip(".")
        where = ctx.command_path if ctx is not None else "builder"
        print(fit(f"error: {message}; see '{where} --help'"), file=sys.stderr)
        return int(getattr(exc, "exit_code", USAGE) or USAGE)
    if code == Interrupted.exit_code:  # typer's main returns 130 for a KeyboardInterrupt (Interrupted) it caught
        interrupted(None)
    return code if isinstance(code, int) else 0


def interrupted(cause: BaseException | None) -> None:
    """The one line of an interrupted run (SIGINT or SIGTERM); the stages' clean-up has run."""
    by = f" by {cause}" if cause is not None and str(cause) else ""
    print(fit(f"error: interrupted{by}; nothing half-done was kept"), file=sys.stderr)
