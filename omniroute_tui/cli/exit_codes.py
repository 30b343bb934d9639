"""What `omniroute` exits with, and the one place an exception becomes an exit code and a message.

stdout is data; every failure is one line on stderr that says what to do next, and an exit code a
script can branch on (docs/cli.md#exit-codes). Commands raise `CliError` subclasses; the edge
(`omniroute_tui.cli.edge`) prints `message_for(exc)` and exits with `exit_code_for(exc)`.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "HEALTHY_STATUSES",
    "AuthRefused",
    "CliError",
    "ExitCode",
    "InvalidValue",
    "NoInstance",
    "NotFound",
    "Unexpected",
    "click_error",
    "exit_code_for",
    "message_for",
]


class ExitCode(IntEnum):
    OK = 0
    """The command did what it was asked."""
    UNEXPECTED = 1
    """Something failed that the operator cannot fix by changing the command: a 5xx, a bug, a strange answer."""
    USAGE = 2
    """Bad usage or an invalid value: the message names the field and what it accepts."""
    NO_INSTANCE = 3
    """Nothing answered at the URL: start an instance (`omniroute serve` or `omniroute tui`) or fix --url."""
    AUTH = 4
    """The instance refused the management token (401) or the client (403)."""
    NOT_FOUND = 5
    """No such provider, connection or model (lockout)."""
    DEGRADED = 6
    """`status` only: the instance answered, and it is not healthy (a breaker is not CLOSED).

    Not a failure of the command (its output is printed as usual), so no message: the code lets a
    script or a monitor ask "is it healthy?" without parsing the output."""


HEALTHY_STATUSES = frozenset({"healthy", "ok"})
"""What `GET /api/monitoring/health` says when nothing is degraded ("ok": OmniRoute's own spelling)."""


class CliError(Exception):
    """A failure the operator can act on; `str()` is the whole one-line message."""

    code: ExitCode = ExitCode.UNEXPECTED


class Unexpected(CliError):
    code = ExitCode.UNEXPECTED


class InvalidValue(CliError):
    code = ExitCode.USAGE


class NoInstance(CliError):
    code = ExitCode.NO_INSTANCE


class AuthRefused(CliError):
    code = ExitCode.AUTH


class NotFound(CliError):
    code = ExitCode.NOT_FOUND


def click_error(exc: BaseException, name: str = "ClickException") -> bool:
    """Is `exc` a click exception of that class (or a subclass)?

    By name, because typer may bring click itself or a vendored copy of it (`typer._click`).
    """
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def exit_code_for(exc: BaseException) -> ExitCode:
    """The only mapping from an exception to an exit code."""
    if isinstance(exc, CliError):
        return exc.code
    if click_error(exc, "UsageError"):
        return ExitCode.USAGE
    if click_error(exc):
        try:
            return ExitCode(getattr(exc, "exit_code", 1))
        except ValueError:
            return ExitCode.UNEXPECTED
    return ExitCode.UNEXPECTED


def message_for(exc: BaseException) -> str:
    """One line for stderr, never a traceback. Our own errors keep their characters (they quote
    names as given, and the edge shows a newline in one as its mark, like the tables); the layout
    newlines of click's and other libraries' messages are folded."""
    if isinstance(exc, CliError):
        return str(exc)
    if click_error(exc):
        text = exc.format_message()  # type: ignore[attr-defined]
        ctx = getattr(exc, "ctx", None)
        if click_error(exc, "UsageError") and ctx is not None:
            text += f" (see `{ctx.command_path} --help`)"
    else:
        detail = str(exc) or "no detail"
        text = f"unexpected error: {type(exc).__name__}: {detail} (set OMNIROUTE_DEBUG=1 for a traceback)"
    return " ".join(text.split())
