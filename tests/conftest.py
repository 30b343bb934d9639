"""What every test may count on, whatever started the test run."""

from __future__ import annotations

import signal

# A run started under `nohup`, or as a shell script's background job, inherits SIGHUP or SIGINT
# ignored, and so would every instance a test starts: `serve` keeps an inherited SIG_IGN (as POSIX
# programs do), so the tests that stop one with those signals would find it still running. The
# tests start from the defaults; the one that wants an ignored signal sets it for its own child.
for _name, _default in (("SIGHUP", signal.SIG_DFL), ("SIGINT", signal.default_int_handler)):
    _sig = getattr(signal, _name, None)
    if _sig is not None and signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, _default)
