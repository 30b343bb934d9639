"""An upstream that writes the bytes it is given: for answers no HTTP server library would write (a
status HTTP does not have, header bytes outside latin-1), which a hostile or broken upstream can."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable

__all__ = ["RawUpstream"]


class RawUpstream:
    """A loopback server answering each request with `answer(path)`'s bytes, then closing the
    connection. `url` is the base URL to configure (`.../v1`)."""

    def __init__(self, answer: Callable[[str], bytes]) -> None:
        self.answer = answer
        self.paths: list[str] = []
        fake = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.settimeout(10)
                data = b""
                while b"\r\n\r\n" not in data:
                    more = sock.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                while len(body) < length:
                    more = sock.recv(65536)
                    if not more:
                        return
                    body += more
                path = lines[0].split(" ")[1]
                fake.paths.append(path)
                sock.sendall(fake.answer(path))

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> RawUpstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @staticmethod
    def response(status_line: bytes, headers: list[bytes], body: bytes, *, length: bool = True) -> bytes:
        """One HTTP/1.1 answer that closes its connection, written as given; without `length`, a
        body that ends where the connection does (no Content-Length, no chunks)."""
        lines = [
            status_line,
            *headers,
            *([b"content-length: %d" % len(body)] if length else []),
            b"connection: close",
        ]
        return b"\r\n".join(lines) + b"\r\n\r\n" + body
