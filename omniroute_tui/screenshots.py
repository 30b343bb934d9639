"""`python -m omniroute_tui.screenshots [DIR]`: regenerate the README's SVGs of the console.

Runs the real demo (`--demo`: the proxy, the simulated upstreams and their client traffic) with
the console headless at 120×40, lets the layers move for 20 s, then captures each tab (each at a
moment that shows what it is for: the flaky breaker OPEN, a model locked out) and the help screen
into DIR (default `screenshots/`). About a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from textual.pilot import Pilot

from omniroute_tui.app import OmniRouteApp, make_app
from proxy import serve
from proxy.demo import DEMO_PORT
from proxy.readmodel import ReadModel, RequestView

SIZE = (120, 40)
MIN_WARMUP_S = 20.0
MAX_WAIT_S = 40.0


def _flaky_open(read: ReadModel, now: float) -> bool:
    flaky = read.breaker("flaky", now)
    return flaky is not None and flaky.state == "OPEN"


def _some_lockout(read: ReadModel, now: float) -> bool:
    return bool(read.lockouts(now))


def _always(read: ReadModel, now: float) -> bool:
    return True


def _telling_trail(read: ReadModel) -> str | None:
    """The newest finished request whose trail has a skip and a fallback (or at least one of them)."""
    finished = [r for r in read.requests(state="done") if r.attempts]
    wanted: Callable[[RequestView], object]
    for wanted in (
        lambda r: r.skipped and any(a.outcome == "fallback" for a in r.attempts),
        lambda r: r.waits or any(a.outcome == "fallback" for a in r.attempts),
    ):
        found = [r for r in finished if wanted(r)]
        if found:
            return found[-1].id
    return None


def _trail_told(read: ReadModel, now: float) -> bool:
    return _telling_trail(read) is not None


# Each view waits (up to MAX_WAIT_S) for the moment that shows what it is for. Breakers first:
# the flaky provider is OPEN for only ~15 s at a time.
VIEWS: tuple[tuple[str, str, Callable[[ReadModel, float], bool]], ...] = (
    ("breakers", "2", _flaky_open),
    ("overview", "1", _always),
    ("connections", "3", _always),
    ("lockouts", "4", _some_lockout),
    ("events", "6", _always),
    ("requests", "7", _trail_told),
    ("settings", "5", _always),
    ("help", "question_mark", _always),
)


def _socket() -> socket.socket:
    """The demo's usual port, so the captures show the URL a newcomer sees; any free one otherwise."""
    try:
        return serve.bind_socket("127.0.0.1", DEMO_PORT)
    except serve.StartupError:
        return serve.bind_socket("127.0.0.1", 0)


def read_model(app: OmniRouteApp) -> ReadModel:
    assert app.runtime is not None  # (screenshots are of the hosted console)
    return app.runtime.read


async def _wait_for(app: OmniRouteApp, pilot: Pilot[int], ready: Callable[[ReadModel, float], bool]) -> None:
    read = read_model(app)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + MAX_WAIT_S
    while not ready(read, read.now()) and loop.time() < deadline:
        await pilot.pause(0.25)


async def capture(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    async with serve.instance(serve.Options(demo=True)) as runtime:
        app = make_app(runtime, serve_sock=_socket())
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(MIN_WARMUP_S)  # let every layer move first
            for name, key, ready in VIEWS:
                await _wait_for(app, pilot, ready)
                await pilot.press(key)
                await pilot.pause(0.8 if name != "settings" else 3.0)  # the cards mount on first visit
                if name == "requests":  # the detail pane tells a trail worth reading
                    picked = _telling_trail(read_model(app))
                    if picked is not None and app.table("requests").select_key(picked):
                        await pilot.pause(0.8)
                path = out / f"{name}.svg"
                path.write_text(
                    app.export_screenshot(title=f"omniroute tui --demo · {name}"), encoding="utf-8"
                )
                written.append(path)
                if name == "help":
                    await pilot.press("escape")
            await pilot.press("q")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    while app.is_running:
                        await pilot.pause(0.1)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m omniroute_tui.screenshots", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", nargs="?", default="screenshots", type=Path, help="output directory")
    args = parser.parse_args(argv)
    for path in asyncio.run(capture(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
