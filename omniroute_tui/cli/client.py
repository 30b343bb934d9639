"""Talking to a running instance: where it is, how to authenticate, and what its answers mean.

Every HTTP failure is translated here, once, into the `CliError` that names the exit code:
nothing listening → 3, 401/403 → 4, 404 for a named thing → 5, 400 → 2 with the server's fields,
anything else → 1. httpx is imported by the commands that call an instance, never at startup.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from omniroute_tui.cli.exit_codes import AuthRefused, InvalidValue, NoInstance, NotFound, Unexpected
from proxy import untrusted
from proxy.scrub import Scrubber, StreamScrubber

if TYPE_CHECKING:
    import httpx

__all__ = ["START_HINT", "TIMEOUT_S", "Api", "Target", "check_url", "resolve_target"]

TIMEOUT_S = 10.0
"""Per request. The management API answers from memory, so anything near this is a hung instance."""

START_HINT = "start one with `omniroute serve` or `omniroute tui`, or point --url / OMNIROUTE_URL at it"
TOKEN_HINT = "set --token or OMNIROUTE_MANAGEMENT_TOKEN"

_WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


@dataclass(frozen=True, slots=True)
class Target:
    """The instance a command talks to."""

    url: str
    """Base URL without a trailing slash, e.g. `http://127.0.0.1:20128`."""
    token: str | None


def resolve_target(
    url: str | None,
    token: str | None,
    config: str | None,
    env: Mapping[str, str] = os.environ,
    state: str | None = None,
) -> Target:
    """`--url`/`OMNIROUTE_URL` wins; then the address of the instance that holds the state file
    (`--state`/`OMNIROUTE_STATE`/the default), as its lock file says; else the config's `[server]`.

    The config's management token is used only with this machine's instance: the config's own
    address, or the one an instance on this machine's state file wrote into its lock. It is never
    sent to a URL given by hand.
    """
    if token:
        _check_token(token, env)
    if url is not None:  # (`--url ''` too: a script's unset variable must not mean "this machine")
        from proxy.config import shown_url

        url = url.strip().rstrip("/")
        problem = check_url(url)
        if problem is not None:
            # Exit 2, not 3: no instance can ever answer at such a URL, so retrying will not help.
            from_env = env.get("OMNIROUTE_URL", "").strip().rstrip("/")
            source = " (from OMNIROUTE_URL)" if from_env and url == from_env else ""
            try:
                shown = shown_url(url)
            except ValueError:
                shown = url
            if shown != url:  # (its user name and password: never printed)
                shown = shown.replace("://", "://…@", 1)
            raise InvalidValue(f"--url {shown!r}{source} is not a usable URL: {problem}")
        return Target(url, token or None)
    from proxy.config import ConfigError, load_config, resolve_config_path, resolve_state_path
    from proxy.statelock import running_owner

    explicit = bool(config or env.get("OMNIROUTE_CONFIG"))
    try:
        loaded = load_config(resolve_config_path(config, env), env, explicit=explicit)
    except ConfigError as exc:
        first = exc.problems[0] if exc.problems else "invalid"
        more = f" (+{len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        where = f"{exc.path}: " if exc.path is not None else ""
        raise InvalidValue(f"{where}{first}{more}; fix it (`omniroute config check`) or pass --url") from None
    server = loaded.server
    owner = running_owner(resolve_state_path(state, env))
    if owner is not None and owner.url:
        parts = urlsplit(owner.url)
        if parts.hostname is not None and parts.port is not None:
            return Target(_address(parts.hostname, parts.port), token or server.management_token)
    return Target(_address(server.host, server.port), token or server.management_token)


def _check_token(token: str, env: Mapping[str, str]) -> None:
    """Exit 2 for a token no header can carry (a token file saved with CRLF), before anything is
    sent: httpx would refuse it in words that show it, or the instance would refuse it (exit 4)."""
    from proxy.config import MANAGEMENT_TOKEN_ENV, UNSENDABLE_SECRET, sendable_secret

    if not sendable_secret(token):
        source = MANAGEMENT_TOKEN_ENV if token == env.get(MANAGEMENT_TOKEN_ENV) else "--token"
        raise InvalidValue(f"{source} {UNSENDABLE_SECRET}")


def _address(host: str, port: int) -> str:
    """The base URL to reach a listen address from this machine (a wildcard means loopback)."""
    host = _WILDCARD_HOSTS.get(host, host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def check_url(url: str) -> str | None:
    """What makes `url` unusable as an instance's address (scheme, host, port), or None if nothing does."""
    from urllib.parse import urlsplit

    from proxy.config import MANAGEMENT_TOKEN_ENV

    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return f"the scheme must be http or https (got {repr(parts.scheme) if parts.scheme else 'none'})"
    if "@" in parts.netloc:
        # Sent as HTTP Basic in place of the token, and shown wherever the URL is (messages, the
        # console's status line): the credential is the token's to carry.
        return f"it holds a user name or password; give the management token with --token (or {MANAGEMENT_TOKEN_ENV})"
    if not parts.hostname:
        return "it names no host"
    try:
        parts.hostname.encode("idna")  # what the client does with it before connecting
    except UnicodeError:
        return "the host name is not one DNS can hold (a label empty or over 63 characters)"
    # By hand: urlsplit's own `.port` accepts 0 and explains a bad one in its words, not ours.
    hostport = parts.netloc.rpartition("@")[2]
    port = hostport.rpartition("]")[2] if hostport.startswith("[") else hostport
    _, colon, digits = port.rpartition(":")
    if not colon or not digits:
        return None  # the scheme's default port
    if not (digits.isascii() and digits.isdecimal()):
        return f"the port must be a number between 1 and 65535 (got {digits!r})"
    if not 1 <= int(digits) <= 65535:
        return f"the port must be between 1 and 65535 (got {int(digits)})"
    return None


def _error_of(content: bytes) -> tuple[str | None, list[dict[str, Any]]]:
    """The `{error: {message, fields}}` of an omniroute answer; (None, []) for anyone else's."""
    try:
        body = json.loads(content)
    except ValueError:
        return None, []
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None, []
    fields = error.get("fields")
    return error["message"], [f for f in fields if isinstance(f, dict)] if isinstance(fields, list) else []


class Api:
    """A short-lived client for one command: `with Api(target) as api: api.get("/api/...")`."""

    def __init__(self, target: Target, *, timeout: float = TIMEOUT_S) -> None:
        import httpx

        self.target = target
        self.timeout_s = timeout
        # The token is this client's secret: a server may quote the headers it was sent (a debug
        # page, a proxy's error), and nothing it answers is printed with the token in it.
        self._scrub = Scrubber([target.token])
        headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        try:
            self._client = httpx.Client(
                base_url=target.url, headers=headers, timeout=timeout, trust_env=False
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError) as exc:
            raise InvalidValue(f"--url {target.url!r} is not a usable URL ({exc})") from None

    def __enter__(self) -> Api:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._client.close()

    def get(self, path: str, *, names: str | None = None) -> Any:
        return self.call("GET", path, names=names)

    def call(self, method: str, path: str, body: object = None, *, names: str | None = None) -> Any:
        """Send one request and return its JSON answer, or raise the `CliError` for its failure.

        `names` describes the thing the path names (`connection 'x'`): a 404 then means "no such
        thing" (exit 5). Without it, a 404 means the URL is not an omniroute instance (exit 3).
        """
        import httpx

        url = self.target.url
        try:
            if body is None:
                response = self._client.request(method, path)
            else:
                response = self._client.request(method, path, json=body)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise InvalidValue(f"--url {url!r} is not a usable URL ({exc})") from None
        except httpx.TimeoutException:
            raise self._hung() from None
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise NoInstance(f"no omniroute instance at {url} ({reason}); {START_HINT}") from None
        return self._answer(method, path, response, names)

    def _hung(self, waited_s: float | None = None) -> NoInstance:
        waited = self.timeout_s if waited_s is None else waited_s
        return NoInstance(
            f"{self.target.url} did not answer within {waited:g} s; is the instance hung? {START_HINT}"
        )

    def stream(self, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """The messages of a server-sent event stream, as (event name, JSON data), until it ends.

        Raises the same `CliError`s as `call` when it cannot be opened; a stream that ends (the
        instance stopped) or breaks is a `NoInstance` too: whoever follows it learns it is over."""
        import httpx

        from proxy import stream
        from proxy.sse import SSEParser

        url = self.target.url
        parser = SSEParser(stream.MESSAGE_LIMIT_BYTES)
        opened = False
        try:
            # Nothing heard, not a ping either, for SILENCE_LIMIT_S: a network gone without a close
            # (the instance is out of reach: exit 3, as when it stops), not a stream to wait on.
            timeout = httpx.Timeout(self.timeout_s, read=stream.SILENCE_LIMIT_S)
            with self._client.stream("GET", path, timeout=timeout) as response:
                if response.status_code != 200:
                    response.read()
                    self._answer("GET", path, response, None)
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    # (a web page, say: no stream that could end, so not an instance that stopped)
                    raise Unexpected(
                        f"{url} answered GET {path.partition('?')[0]} with something that is not an"
                        " event stream; is it an omniroute instance?"
                    )
                opened = True
                withheld = StreamScrubber(self._scrub)
                for chunk in response.iter_raw():
                    for event in parser.feed(withheld.feed(chunk)):
                        data = event.json_object()
                        if data is not None:
                            yield event.event, data
        except httpx.TimeoutException:
            if opened:
                raise NoInstance(
                    f"the stream from {url} went silent for {stream.SILENCE_LIMIT_S:g} s (no ping either):"
                    " the link is gone"
                ) from None
            raise self._hung(stream.SILENCE_LIMIT_S) from None  # (the stream's read timeout)
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            if not opened:  # nothing there to follow: as `call` says it
                raise NoInstance(f"no omniroute instance at {url} ({reason}); {START_HINT}") from None
            raise NoInstance(f"the stream from {url} broke ({reason})") from None
        raise NoInstance(f"{url} ended the stream: the instance stopped")

    def _answer(self, method: str, path: str, response: httpx.Response, names: str | None) -> Any:
        status = response.status_code
        url = self.target.url
        scrub = self._scrub
        content = scrub.secrets(response.content)
        message, fields = _error_of(content)
        if message is not None:
            message = scrub(message)
            fields = [{k: scrub(v) if isinstance(v, str) else v for k, v in f.items()} for f in fields]
        if status in (401, 403):
            if status == 401 and self.target.token is None:
                raise AuthRefused(f"{url} needs a management token: {TOKEN_HINT}")
            if status == 401:
                raise AuthRefused(f"{url} refused the management token: {TOKEN_HINT} to the right one")
            why = message or "forbidden"
            raise AuthRefused(
                f"{url} refused this client ({why}); set server.management_token and {TOKEN_HINT}"
            )
        if status == 404:
            if names is not None and message is not None:
                raise NotFound(f"{message} at {url}")
            raise NoInstance(
                f"{url} does not serve the omniroute management API ({method} {path} answered 404); {START_HINT}"
            )
        if status in (400, 413, 422):
            if fields:
                detail = "; ".join(f"{f.get('field') or 'body'}: {f.get('message')}" for f in fields)
            else:
                detail = message or f"{status} {response.reason_phrase}"
            raise InvalidValue(f"rejected by {url}: {detail}")
        if status >= 300:
            # (what some other server said, an HTML page as often as not: its layout folded)
            text = content.decode(response.encoding or "utf-8", "replace")
            detail = message or scrub(" ".join(text.split()))[:200] or response.reason_phrase
            raise Unexpected(f"{url} answered {status} to {method} {path}: {detail}")
        try:
            # (NaN and Infinity are Python's, not JSON's: passed on, `--json` would print no JSON.)
            return json.loads(content, parse_constant=untrusted.no_constant)
        except ValueError:
            raise Unexpected(
                f"{url} answered {method} {path} with something that is not JSON; is it an omniroute instance?"
            ) from None
