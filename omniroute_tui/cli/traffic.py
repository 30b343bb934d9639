"""Traffic commands: `requests` (the request trail) and `stats` (per provider and connection).

`requests` reads `GET /api/requests` page by page (by `seq`, 1,000 at a time) and keeps the
newest `--limit`; `--json` prints those records as the API gives them (a list, oldest first).
`requests --follow` prints each request as it ends, from the live stream (`/api/stream`).
`stats` GETs `/api/stats?window=`; `--json` prints that document unchanged. The API checks the
window, so a bad one is its 400 (exit 2) with the names it takes.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer

from omniroute_tui import format as fmt
from omniroute_tui.cli.options import ConfigOpt, JsonOpt, OutputOpt, TokenOpt, UrlOpt, as_json, connect
from omniroute_tui.cli.output import cell, console, emit, epoch_ms, note, table

if TYPE_CHECKING:
    from rich.console import RenderableType

app = typer.Typer()

PANEL = "Traffic"
REQUESTS = "/api/requests"
STATS = "/api/stats"
STREAM = "/api/stream"
ENDED_STATES = frozenset({"done", "failed", "client_gone"})
PAGE = 1000
"""The most records one `GET /api/requests` answers (its `limit` ceiling)."""
FAILED_STATES = frozenset({"failed", "client_gone"})


@app.command(rich_help_panel=PANEL)
def requests(
    failed: Annotated[
        bool, typer.Option("--failed", help="Only requests that failed or whose client left.")
    ] = False,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, max=100_000, help="Show the newest N (default 50).")
    ] = 50,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Print the newest N that ended (at most 200), then each request as it ends (from the live stream), until Ctrl+C or the instance stops.",
        ),
    ] = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """The newest requests through the proxy, oldest first: where each went, status, timings, tokens.
    With --follow, one line per request as it ends (with --json, one Request object per line).

    Example: [bold]omniroute requests --failed --json | jq -r '.[] | "\\(.id) \\(.code)"'[/bold]
    """
    json_ = as_json(json_, output)
    if follow:
        with connect(url, token, config) as api:
            try:
                _follow(api.stream(f"{STREAM}?kinds=request"), failed=failed, json_=json_, newest=limit)
            except KeyboardInterrupt:
                return
        return
    kept: deque[dict[str, Any]] = deque(maxlen=limit)
    with connect(url, token, config) as api:
        after = 0
        while True:
            page: list[dict[str, Any]] = api.get(f"{REQUESTS}?after={after}&limit={PAGE}")["requests"]
            kept.extend(r for r in page if not failed or r.get("state") in FAILED_STATES)
            if len(page) < PAGE:
                break
            after = page[-1]["seq"]
    rows = list(kept)
    emit(rows, json_=json_, human=lambda: _requests_table(rows, failed))


@app.command(rich_help_panel=PANEL)
def stats(
    window: Annotated[str, typer.Option("--window", "-w", help="1m, 5m or 15m.")] = "5m",
    fleet: Annotated[
        bool, typer.Option("--fleet", help="Summed over the fleet's live replicas, not this replica's own.")
    ] = False,
    json_: JsonOpt = False,
    output: OutputOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Requests, errors, latency (p50/p95), TTFT and tokens/s per provider and connection.

    Example: [bold]omniroute stats --window 1m --json | jq '.providers'[/bold]
    """
    json_ = as_json(json_, output)
    query = f"?window={quote(window, safe='')}" + ("&scope=fleet" if fleet else "")
    with connect(url, token, config) as api:
        doc: dict[str, Any] = api.get(f"{STATS}{query}")
    emit(doc, json_=json_, human=lambda: _stats_table(doc))


# ---------------------------------------------------------------------------------------------
# Human renderings.


def where(r: dict[str, Any]) -> str | None:
    """`provider/connection` of the request's last attempt; None when it reached no upstream."""
    attempts = r.get("attempts") or []
    if not attempts:
        return None
    last = attempts[-1]
    return f"{last['provider']}/{last['connectionId']}"


def _follow(
    messages: Iterator[tuple[str, dict[str, Any]]], *, failed: bool, json_: bool, newest: int = 0
) -> None:
    """The `newest` requests that ended before following began, then each request once, as it
    ends. Both come from the stream: its first snapshot holds the SNAPSHOT_REQUESTS newest ended
    ones; a later snapshot is sent in place of what a follower missed (it fell behind, or came back
    too late to resume), and what it says ended since is printed from it. A record comes again in
    a snapshot after a reconnect, and while it is alive: each is printed once."""
    printed: deque[str] = deque(maxlen=10_000)
    seen: set[str] = set()

    def shown(record: dict[str, Any]) -> bool:
        return record.get("state") in (FAILED_STATES if failed else ENDED_STATES)

    def once(record: dict[str, Any], *, show: bool = True) -> None:
        rid = record.get("id")
        if record.get("state") not in ENDED_STATES or not isinstance(rid, str) or rid in seen:
            return
        if len(printed) == printed.maxlen:
            seen.discard(printed[0])
        printed.append(rid)
        seen.add(rid)
        if show and shown(record):
            _print_request(record, json_=json_)

    began = False
    for kind, data in messages:
        if kind == "snapshot":
            recent = [r for r in (data.get("requests") or {}).get("recent") or [] if isinstance(r, dict)]
            if not began:  # the history: the newest few shown, the rest only marked as seen
                history = [r for r in recent if shown(r)][-newest:] if newest > 0 else []
                keep = {id(r) for r in history}
                for record in recent:
                    once(record, show=id(record) in keep)
                began = True
            else:
                for record in recent:  # oldest first
                    once(record)
        elif kind == "request":
            once(data)


def _print_request(record: dict[str, Any], *, json_: bool) -> None:
    if json_:
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    else:
        _line(record)


def _line(r: dict[str, Any]) -> None:
    from rich.text import Text

    usage = r.get("usage") or {}
    state = r["state"]
    style = {"failed": "red", "client_gone": "dim"}.get(state, "")
    spans = [
        cell(fmt.clock_time(epoch_ms(r.get("startedAt")))),
        cell(r["id"][:8]),
        cell(r.get("modelAsked")),
        cell(where(r)),
        cell(_status(r), style),
        cell(fmt.latency(r.get("durationMs")) if r.get("durationMs") is not None else None),
        cell(f"{usage['totalTokens']} tok" if usage.get("totalTokens") is not None else None),
    ]
    console().print(Text("  ").join(spans))
    sys.stdout.flush()


def _status(r: dict[str, Any]) -> str:
    state = r["state"]
    status = r.get("status")
    if state in ("done", "failed") and status is not None:
        return f"{status} {r['code']}" if r.get("code") and state == "failed" else str(status)
    return str(state).replace("_", " ")


NARROW_REQUESTS = 120
"""Below this many columns the requests table leaves out Attempts, TTFT and Tokens (`--json` has
them): at 80 or 100 columns its nine would leave each a few cells, and no row readable."""


def _requests_table(rows: list[dict[str, Any]], failed: bool) -> RenderableType | None:
    if not rows:
        note("No failed request in the trail." if failed else "No request in the trail yet.")
        return None
    full = console().width >= NARROW_REQUESTS
    headers = ["Time", "Id", "Model", "Went to", "Attempts", "Status", "Duration", "TTFT", "Tokens"]
    shown = [h for h in headers if full or h not in ("Attempts", "TTFT", "Tokens")]
    t = table(*shown, keep=4)
    status = t.columns[shown.index("Status")]
    status.no_wrap, status.overflow = True, "ellipsis"  # one line a request: its code ends in "…"
    for r in rows:
        usage = r.get("usage") or {}
        state = r["state"]
        style = {"failed": "red", "client_gone": "dim"}.get(state, "" if r.get("endedAt") else "cyan")
        cells = {
            "Time": cell(fmt.clock_time(epoch_ms(r.get("startedAt")))),
            "Id": cell(r["id"][:8]),
            "Model": cell(r.get("modelAsked")),
            "Went to": cell(where(r)),
            "Attempts": cell(len(r.get("attempts") or [])),
            "Status": cell(_status(r), style),
            "Duration": cell(fmt.latency(r.get("durationMs")) if r.get("durationMs") is not None else None),
            "TTFT": cell(fmt.latency(r.get("ttftMs")) if r.get("ttftMs") is not None else None),
            "Tokens": cell(usage.get("totalTokens")),
        }
        t.add_row(*(cells[h] for h in shown))
    return t


def _stats_table(doc: dict[str, Any]) -> RenderableType | None:
    rows = [("provider", k, v) for k, v in doc["providers"].items()] + [
        ("connection", k, v) for k, v in doc["connections"].items()
    ]
    if not rows:
        note("No providers are configured.")
        return None
    replicas = doc.get("replicas")
    title = f"last {doc['window']}"
    if replicas is not None:
        summed = replicas["summed"]
        title += f", fleet of {len(summed)} replica{'s' if len(summed) != 1 else ''}"
        left_out = [*replicas["stale"], *replicas["missing"]]
        if left_out:
            note(f"Not summed (stale or missing): {', '.join(left_out)}.")
    t = table(
        "Scope", "Name", "Requests", "Errors", "Error rate", "p50", "p95", "TTFT p50", "Tokens/s",
        keep=2, title=title,
    )  # fmt: skip
    for scope, name, s in rows:
        t.add_row(
            cell(scope, "dim"),
            cell(name, "bold" if scope == "provider" else ""),
            cell(s["requests"]),
            cell(s["errors"], "red" if s["errors"] else ""),
            cell(fmt.percent(s["errorRate"])),
            cell(fmt.latency(s["p50Ms"])),
            cell(fmt.latency(s["p95Ms"])),
            cell(fmt.latency(s["ttftP50Ms"])),
            cell(fmt.NONE if s["tokensPerSecond"] is None else f"{s['tokensPerSecond']:g}"),
        )
    return t
