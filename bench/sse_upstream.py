"""A tiny, fast OpenAI-style SSE upstream for the streaming relay benchmark (raw asyncio, no framework).

    python bench/sse_upstream.py --port 18090 [--chunks 1000]

`POST /v1/chat/completions` answers `text/event-stream` with `--chunks` `data:` events and then
`data: [DONE]`; `POST /v1/messages` the same stream in Anthropic's Messages form (`message_start`
and `content_block_start` in the first write, `--chunks` `content_block_delta` events, then
`content_block_stop`, `message_delta` and `message_stop` in the last); chunked transfer encoding, each event its own write (and its own send: the loop
is yielded to between events, so the kernel cannot merge them before the reader is ready). This
is as fast as one Python process can emit separate events, so the proxy, not the upstream, sets
the pace of a relay. A model whose name ends in `-pause` gets the first event, then a pause of
`--pause-ms`, then the rest: a relay that buffers would hold the first event back until the pause
ends. `GET /v1/models` lists the model. The connection is kept alive between requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

MODELS = b'{"object":"list","data":[{"id":"bench-model","object":"model","created":0,"owned_by":"bench"}]}'
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _frame(payload: bytes) -> bytes:
    """One chunked-encoding frame carrying `payload`."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event_frames(chunks: int) -> list[bytes]:
    """Pre-built frames: `chunks` completion-chunk events, then `[DONE]`, then the last-chunk marker."""
    frames = []
    for i in range(chunks):
        event = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "bench-model",
            "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}],
        }
        frames.append(_frame(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"))
    frames.append(_frame(b"data: [DONE]\n\n"))
    frames.append(b"0\r\n\r\n")
    return frames


def _event(name: str, data: dict[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, separators=(',', ':'))}\n\n".encode()


def message_frames(chunks: int) -> list[bytes]:
    """Pre-built frames of an Anthropic Messages stream: `chunks` text deltas between its opening
    (message_start, content_block_start: one write, as the API sends them) and its three closing
    events (one write)."""
    start = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "bench-model",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    frames = [
        _frame(
            _event("message_start", {"message": start})
            + _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        )
    ]
    for i in range(chunks):
        delta = {"index": 0, "delta": {"type": "text_delta", "text": f"tok{i} "}}
        frames.append(_frame(_event("content_block_delta", delta)))
    usage = {"output_tokens": chunks}
    frames.append(
        _frame(
            _event("content_block_stop", {"index": 0})
            + _event(
                "message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": usage}
            )
            + _event("message_stop", {})
        )
    )
    frames.append(b"0\r\n\r\n")
    return frames


def _simple(status: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )


class Upstream:
    def __init__(self, chunks: int, pause_ms: float) -> None:
        self.frames = event_frames(chunks)
        self.message_frames = message_frames(chunks)
        self.pause_s = pause_ms / 1000

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                request_line, *lines = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                length = 0
                for line in lines:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if method == "GET" and path.startswith("/v1/models"):
                    writer.write(_simple("200 OK", MODELS))
                elif method == "POST" and path.startswith("/v1/chat/completions"):
                    model = str(json.loads(body or b"{}").get("model", ""))
                    await self.stream(writer, self.frames, pause=model.endswith("-pause"))
                elif method == "POST" and path.startswith("/v1/messages"):
                    model = str(json.loads(body or b"{}").get("model", ""))
                    await self.stream(writer, self.message_frames, pause=model.endswith("-pause"))
                else:
                    writer.write(_simple("404 Not Found", b'{"error":{"message":"not found"}}'))
                await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def stream(self, writer: asyncio.StreamWriter, frames: list[bytes], *, pause: bool) -> None:
        writer.write(SSE_HEAD)
        first, *rest = frames
        writer.write(first)
        if pause:
            await writer.drain()
            await asyncio.sleep(self.pause_s)
        for frame in rest:
            await asyncio.sleep(0)  # one event per send: let the loop flush before the next write
            writer.write(frame)
            if writer.transport.get_write_buffer_size() > 256 * 1024:
                await writer.drain()


async def serve(port: int, chunks: int, pause_ms: float) -> None:
    upstream = Upstream(chunks, pause_ms)
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=18090)
    ap.add_argument("--chunks", type=int, default=1000)
    ap.add_argument("--pause-ms", type=float, default=200.0)
    args = ap.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port, args.chunks, args.pause_ms))
    else:
        uvloop.run(serve(args.port, args.chunks, args.pause_ms))


if __name__ == "__main__":
    main()
