"""The edge of the program: every exception becomes one line on stderr and an exit code, never a traceback.

`Edge` is the root click group. Its `main` runs the command non-standalone, so errors come back
here instead of being printed by click or typer (whose Rich error panels span many lines), and
maps them with `exit_code_for` / `message_for`. Typer's CliRunner calls this same `main`, so the
tests see exactly what a shell sees. `OMNIROUTE_DEBUG=1` adds the traceback for a bug report.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from typer.core import TyperGroup

from omniroute_tui.cli.exit_codes import ExitCode, click_error, exit_code_for, message_for
from omniroute_tui.untrusted import visible

__all__ = ["Edge", "fail"]


def fail(exc: BaseException) -> NoReturn:
    """Print the one-line message for `exc` and exit with its code."""
    if os.environ.get("OMNIROUTE_DEBUG") and not click_error(exc):
        traceback.print_exception(exc, file=sys.stderr)
    sys.stderr.write(f"omniroute: {visible(message_for(exc))}\n")
    sys.stderr.flush()
    sys.exit(int(exit_code_for(exc)))


class Edge(TyperGroup):
    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, windows_expand_args, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except Exception as exc:
            if click_error(exc, "NoArgsIsHelpError"):
                # Building the error printed the help already (typer's Rich help writes it directly).
                if exc.format_message().strip():  # type: ignore[attr-defined]
                    exc.show()  # type: ignore[attr-defined]
                sys.exit(int(ExitCode.USAGE))
            if click_error(exc, "Abort"):
                sys.stderr.write("omniroute: aborted\n")
                sys.exit(int(ExitCode.UNEXPECTED))
            fail(exc)
        sys.exit(rv if isinstance(rv, int) else int(ExitCode.OK))
