"""The console's terminal driver: safe when the terminal goes away, and ASCII when asked.

When a terminal goes away (its window closed, `tmux kill-server`, an SSH disconnect) the kernel
sends SIGHUP and SIGCONT to the session leader, and from then on every write to the terminal fails
with EIO and every read returns EOF at once. Textual's Linux driver does not expect that:

- its writer thread dies on the first EIO; its queue (30 writes) then fills, and the next write,
  from the event loop, blocks forever in `Queue.put`. Nothing runs in the loop any more: not the
  quit the SIGHUP asked for, not the handler of a later SIGTERM. The proxy's listening socket
  stays open (the kernel keeps accepting connections no one serves) and only SIGKILL ends it.
- the SIGCONT handler restarts application mode on the dead terminal (a new writer, a new reader).
- the input thread spins on the EOF.

`ConsoleDriver` is that driver made safe for it: output that fails is dropped (the writer never
dies, the queue never fills), SIGCONT is ignored on a terminal that hung up, and `hang_up()` stops
the input thread, points stdio at /dev/null and tells the app, which stops like `q` does.
"""

from __future__ import annotations

import contextlib
import os
import termios
import threading
from collections.abc import Callable
from typing import IO, Any

from textual.drivers.linux_driver import LinuxDriver

from omniroute_tui.messages import TerminalGone
from omniroute_tui.terminal import to_ascii
from proxy.signals import last_words, release_lost_terminal, terminal_hung_up


class _Output:
    """The file Textual's writer thread writes to: the terminal, until a write fails.

    Then everything else is dropped, so that the writer keeps emptying its queue (a dead writer is
    what blocked the loop), and the driver hears of it once, from the writer thread.
    """

    def __init__(self, file: IO[str], failed: Callable[[], object]) -> None:
        self._file = file
        self._failed = failed
        self.dropping = threading.Event()

    def write(self, text: str) -> None:
        if not self.dropping.is_set():
            try:
                self._file.write(text)
            except OSError:
                self._fail()

    def flush(self) -> None:
        if not self.dropping.is_set():
            try:
                self._file.flush()
            except OSError:
                self._fail()

    def fileno(self) -> int:
        return self._file.fileno()

    def _fail(self) -> None:
        self.dropping.set()
        with contextlib.suppress(Exception):  # the writer thread must outlive anything that goes wrong
            self._failed()


class ConsoleDriver(LinuxDriver):
    """Textual's Linux driver for a terminal that may go away (see the module's doc)."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.gone = False
        # LinuxDriver hands `_file` to the writer thread it creates in start_application_mode.
        if self._file is None:  # (sys.__stderr__: None only when the process has no fd 2)
            raise RuntimeError("the console needs a terminal on standard error")
        self._output = _Output(self._file, self._output_failed)
        self._file = self._output  # type: ignore[assignment]

    def _output_failed(self) -> None:
        """In the writer thread: a write failed, so the terminal is most likely gone.

        A terminal that is not the process's controlling terminal sends no SIGHUP when it goes: this
        is then the only news of it.
        """
        self._loop.call_soon_threadsafe(self.check_terminal, True)  # RuntimeError once the loop closed

    def check_terminal(self, output_failed: bool = False) -> bool:
        """In the loop: has the terminal gone away? If so (or if output failed), `hang_up`."""
        if not self.gone and (output_failed or terminal_hung_up(self.fileno)):
            self.hang_up()
        return self.gone

    def hang_up(self) -> None:
        """In the loop, once: there is no terminal any more. Stop using it; the app stops."""
        if self.gone:
            return
        self.gone = True
        self._output.dropping.set()
        # Ends the input thread's loop now: it would spin on EOF (the dead terminal's, then
        # /dev/null's) until the app's shutdown ended it.
        self.exit_event.set()
        release_lost_terminal()
        self._app.post_message(TerminalGone())

    def _sigcont_application(self, *args: Any) -> None:
        # The kernel follows the SIGHUP of a hang-up with a SIGCONT, and Textual would answer it by
        # restarting application mode on the dead terminal. Only a live terminal can be resumed.
        if not self.gone and not terminal_hung_up(self.fileno):
            super()._sigcont_application(*args)


class SavedModes:
    """The terminal's modes before the console changed them, to put back on an immediate exit.

    Textual restores the terminal when the app stops; an immediate exit (a second signal, or a stop
    past its deadline) skips that, and would leave a live terminal in raw mode on the alternate
    screen. Best effort, and never hangs: termios calls and `last_words` only.
    """

    # Mouse reporting, bracketed paste, focus events and the kitty keyboard protocol off, line wrap
    # on, the normal screen and the cursor back: what LinuxDriver.stop_application_mode undoes.
    LEAVE = (
        b"\x1b[?1000l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?1016l\x1b[?2004l\x1b[?1004l"
        b"\x1b[<u\x1b[?7h\x1b[?1049l\x1b[?25h"
    )

    def __init__(self) -> None:
        self._fd: int | None = None
        self._modes: list[Any] | None = None
        if os.isatty(0):
            try:
                self._modes = termios.tcgetattr(0)
                self._fd = 0
            except termios.error:
                pass

    def restore(self) -> None:
        if self._fd is None or self._modes is None:
            return
        try:
            termios.tcsetattr(self._fd, termios.TCSANOW, self._modes)
        except termios.error:
            return  # the terminal is gone: nothing to put back
        last_words(2, self.LEAVE)  # Textual draws on stderr


class AsciiDriver(ConsoleDriver):
    """For a locale that is not UTF-8: everything the console, Textual or Rich draws leaves here,
    so each non-ASCII character is replaced by a same-width ASCII look-alike on its way out
    (`omniroute_tui.terminal.to_ascii`) and nothing drawn anywhere can slip past it."""

    def write(self, data: str) -> None:
        super().write(to_ascii(data))
