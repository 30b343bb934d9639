"""The config file (`config.toml`) read into frozen dataclasses, or the embedded default.

The program only reads this file (`omniroute config init` writes a starter). A bad file must stop the
program with one clear message, never a traceback: every problem is collected in one pass and
reported together, each line naming the file and the dotted key (or the line, for TOML syntax
errors), so the operator can fix them all at once.

Schema (docs/configuration.md): `[server]`, `[providers.<id>]` with `[[providers.<id>.connections]]`,
`[[providers.<id>.restate]]` and `[providers.<id>.headers]`, `[combos.<name>]`, and `[state]`.

Long on purpose (about 1,000 lines): the dataclasses, their reader and the starter file are one
file format, and most of the reader is checks that belong to one key each (ids, hosts, origins,
URLs, APIs, restatement rules, the references between providers, connections and combos), each
with a message naming the file, the key, the line and what it accepts. The reader takes from the
dataclasses what they already say (a table's keys, a key's default); a reader driven wholly by
their fields was weighed and left: only the plain integers and booleans are generic, while every
other key's check and message would move away from the key into metadata.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import hashlib
import ipaddress
import os
import re
import tomllib
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

import platformdirs

from proxy.apis import API_NAMES, AUTH_STYLES, DEFAULT_APIS, AuthStyle, builtin_apis
from proxy.resilience.outcome import ProviderClass
from proxy.resilience.restate import RestatementRule, rule_from_config
from proxy.scrub import MIN_SECRET_LENGTH

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ComboStrategy = Literal["priority", "round-robin"]

BUILTIN_LOCAL_PROVIDERS: dict[str, str] = {
    "ollama": "http://localhost:11434/v1",
    "lmstudio": "http://localhost:1234/v1",
    "llamacpp": "http://127.0.0.1:8080/v1",
    "vllm": "http://localhost:8000/v1",
}

MANAGEMENT_TOKEN_ENV = "OMNIROUTE_MANAGEMENT_TOKEN"
CONFIG_PATH_ENV = "OMNIROUTE_CONFIG"
STATE_PATH_ENV = "OMNIROUTE_STATE"
STATE_BACKEND_ENV = "OMNIROUTE_STATE_BACKEND"
_REDIS_SCHEMES = ("redis", "rediss", "unix")

# Ids end up in URLs (/api/resilience/connections/{id}/reset), in `provider/model` targets and in
# `provider:connection:model` lockout keys, so '/', ':' and whitespace are kept out of them.
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SECRET_RE = re.compile(r"[\x21-\x7e]+")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TOML_ERROR_RE = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.DOTALL)
_CLASS_CHOICES: tuple[ProviderClass, ...] = ("local", "apikey", "oauth")
_STRATEGIES: tuple[ComboStrategy, ...] = ("priority", "round-robin")

UNSENDABLE_SECRET = (
    "holds a space, a control character (a trailing newline?) or a non-ASCII character; "
    "it is sent in a header and must be printable ASCII"
)


def sendable_secret(secret: str) -> bool:
    """Whether a key or token can travel as an HTTP header value as it is.

    A trailing newline from a secrets file or an EnvironmentFile is the usual way to fail this:
    such a key makes every request that sends it fail, such a token locks every client out.
    """
    return _SECRET_RE.fullmatch(secret) is not None


_TIMEOUT_RANGE = (1, 3_600_000)


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    id: str
    provider: str
    name: str
    api_key: str | None = field(repr=False)
    """The resolved key: the inline `api_key`, or the value of `api_key_env` (None when unset)."""
    api_key_env: str | None
    priority: int = 100
    max_concurrent: int | None = None
    enabled: bool = True
    disable_cooling: bool = False

    def fingerprint(self) -> str:
        """A short digest of the resolved key: the engine compares it with the stored one to notice a changed
        credential (which lifts a terminal state) without ever persisting the key itself."""
        return hashlib.sha256((self.api_key or "").encode()).hexdigest()[:16]

    def masked_key(self) -> str | None:
        """`sk-…abcd` for display. Shorter keys show less, so a mask never reveals most of a key."""
        key = self.api_key
        if not key:
            return None
        if len(key) >= 12:
            return f"{key[:3]}…{key[-4:]}"
        if len(key) >= 5:
            return f"…{key[-2:]}"
        return "…"


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    id: str
    provider_class: ProviderClass
    base_url: str
    """http(s) URL without a trailing slash."""
    connections: tuple[ConnectionConfig, ...]
    per_model_quota: bool
    rate_limit: bool | None
    """None: follow `requestQueue.autoEnableApiKeyProviders`."""
    restate: tuple[RestatementRule, ...]
    """The file's rules only; `restate.rules_for(id, restate)` adds the built-ins."""
    headers: Mapping[str, str]
    apis: frozenset[str] = DEFAULT_APIS
    """The wire APIs this provider answers (`proxy.apis.API_NAMES`); only these are routed to it."""
    auth: AuthStyle = "bearer"
    """How the key travels: `Authorization: Bearer`, or Anthropic's `x-api-key`."""


@dataclass(frozen=True, slots=True)
class ComboConfig:
    name: str
    strategy: ComboStrategy
    targets: tuple[str, ...]
    """`provider/model` strings; the provider part names a configured provider."""


REQUEST_HISTORY = 2000
"""Finished request records kept by default (`server.request_history`)."""
REQUEST_HISTORY_MAX = 100_000


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 20128
    management_token: str | None = field(default=None, repr=False)
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    default_combo: str | None = None
    connect_timeout_ms: int = 10_000
    first_byte_timeout_ms: int = 120_000
    idle_timeout_ms: int = 120_000
    allowed_hosts: tuple[str, ...] = ()
    """Host names (lower-case, no port) answered besides loopback ones when no credential is asked."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins (`scheme://host[:port]`, lower-case) allowed to call the proxy; default none."""
    request_history: int = REQUEST_HISTORY
    """Finished request records kept in memory; 0 turns the request trail and statistics off."""

    def bind_refusal(self, host: str | None = None) -> str | None:
        """Why binding `host` (default: the configured one) must be refused, or None when it is safe.

        A non-loopback bind exposes the proxy and its management API, so it needs both a management token
        and client api_keys (docs/operations.md#opening-to-a-lan)."""
        host = self.host if host is None else host
        if is_loopback_host(host) or (self.management_token and self.api_keys):
            return None
        return (
            f"refusing to listen on {host}: a non-loopback address needs server.management_token "
            f"(or {MANAGEMENT_TOKEN_ENV}) and server.api_keys"
        )


@dataclass(frozen=True, slots=True)
class StateConfig:
    """`[state]`: where the resilience state lives (docs/configuration.md#state)."""

    backend: str = "sqlite"
    """`sqlite` (the state file, one process) or a Redis URL (`redis://host:6379/0`): a fleet of
    replicas sharing one resilience state."""
    key_prefix: str = "omniroute:"
    """Every Redis key starts with it, so several fleets can share one Redis."""

    @property
    def shared(self) -> bool:
        return self.backend != "sqlite"

    @property
    def shown(self) -> str:
        """The backend as it may be shown: a Redis URL without the password it may carry, with its
        database (`/5`: replicas on another database of the same Redis are another fleet)."""
        if not self.shared:
            return self.backend
        return shown_url(self.backend, query=False).rstrip("/")  # (`redis://h:6379/` says no more)


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig
    providers: Mapping[str, ProviderConfig]
    combos: Mapping[str, ComboConfig]
    source: Path | None
    """The file read, or None for the embedded default."""
    warnings: tuple[str, ...] = ()
    state: StateConfig = field(default_factory=StateConfig)
    _by_id: Mapping[str, ConnectionConfig] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id = {c.id: c for p in self.providers.values() for c in p.connections}
        object.__setattr__(self, "_by_id", MappingProxyType(by_id))

    def connection(self, connection_id: str) -> ConnectionConfig | None:
        return self._by_id.get(connection_id)

    def refusals(self) -> list[Problem]:
        """What `omniroute serve` refuses to start with, as configured (no --host/--port given):
        a non-loopback host without a management token and api_keys."""
        refusal = self.server.bind_refusal()
        return [Problem(refusal, "server.host")] if refusal is not None else []

    def secrets(self) -> list[str]:
        """Every secret the file configures (or the environment supplies): upstream keys, client
        api_keys, the management token, and a provider header named like a credential (Azure
        OpenAI's `api-key`, an `X-Auth-Token`). None of them may appear in what the program shows."""
        server = self.server
        keys = [c.api_key for c in self._by_id.values() if c.api_key]
        keys += [
            value
            for provider in self.providers.values()
            for name, value in provider.headers.items()
            if _CREDENTIAL_HEADER.search(name)
        ]
        token = [server.management_token] if server.management_token else []
        # A Redis URL may carry its password (redis://:pw@host), and a base_url its user name and
        # password, sent upstream as HTTP Basic: secrets like the others, as written, as sent.
        urls = [p.base_url for p in self.providers.values()]
        if self.state.shared:
            urls.append(self.state.backend)
        return [*keys, *server.api_keys, *token, *(secret for url in urls for secret in _url_secrets(url))]


def _url_secrets(url: str) -> list[str]:
    """The password a URL carries: as written, decoded, and as the HTTP Basic credential it is sent as."""
    parts = urlsplit(url)
    if parts.password is None:
        return []
    password = unquote(parts.password)
    basic = base64.b64encode(
        f"{unquote(parts.username or '')}:{password}".encode("latin-1", "replace")
    ).decode()
    return list(dict.fromkeys(p for p in (parts.password, password, basic) if p))


_CREDENTIAL_HEADER = re.compile(r"key|token|secret|auth|password|credential|cookie", re.IGNORECASE)
"""A header name that says its value is a credential (`api-key`, `X-Auth-Token`, `Authorization`)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a config file: at a dotted `key` (`providers.x.class`), or at a `line`
    (TOML syntax), or about the whole file. `line` is where the key is written, when it can be told."""

    message: str
    key: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        if self.key:
            return f"{self.key}: {self.message}"
        if self.line is not None:
            return f"line {self.line}: {self.message}"
        return self.message

    def to_dict(self, path: Path | None) -> dict[str, object]:
        """`{file, key, line, message}`, as `omniroute config check --json` lists problems."""
        return {
            "file": None if path is None else str(path),
            "key": self.key,
            "line": self.line,
            "message": self.message,
        }


class ConfigError(Exception):
    """A config file that cannot be used. `str()` is the whole message, one problem per line."""

    def __init__(
        self, path: Path | None, problems: Sequence[Problem | str], partial: Config | None = None
    ) -> None:
        self.path = path
        self.problems = tuple(p if isinstance(p, Problem) else Problem(p) for p in problems)
        self.partial = partial
        """The file as far as it could be read, when it parsed (`with_refusals` reads it)."""
        prefix = f"{path}: " if path is not None else ""
        super().__init__("\n".join(f"{prefix}{p}" for p in self.problems))

    def with_refusals(self, host: str | None = None, port: int | None = None) -> ConfigError:
        """This error with what a start would also refuse (`Config.refusals`, with the command
        line's `host` and `port` in the file's place), so that a file is told every problem at once:
        a non-loopback host without tokens was said only once the other problems were fixed. Not
        when the `[server]` section has problems of its own: its refusal would read a guess."""
        partial = self.partial
        if partial is None or any(p.key is not None and p.key.startswith("server.") for p in self.problems):
            return self
        server = replace(
            partial.server,
            host=host if host is not None else partial.server.host,
            port=port if port is not None else partial.server.port,
        )
        refusals = replace(partial, server=server).refusals()
        if not refusals:
            return self
        text = _read_text(self.path)
        lines = _key_lines(text) if text is not None and host is None else {}
        return ConfigError(
            self.path, [*self.problems, *(replace(p, line=_line_of(p.key, lines)) for p in refusals)]
        )


def is_loopback_host(host: str) -> bool:
    """Is `host` (a name or an address, IPv6 with or without brackets) this machine's loopback?

    `localhost` and any `*.localhost` (RFC 6761: resolvers, browsers included, answer them with
    loopback themselves, so no DNS record can point them elsewhere), 127.0.0.0/8, ::1, and
    ::ffff:127.x.y.z (an IPv4 loopback client as a dual-stack socket reports it)."""
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def host_name(value: str) -> str:
    """The host of a `Host` header (or a config entry): lower-case, without port, brackets or the
    trailing dot of an absolute name. `[::1]:20128` -> `::1`, `Proxy.LAN.:80` -> `proxy.lan`."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :] if end > 0 else None
        if rest is None or not (rest == "" or (rest[:1] == ":" and rest[1:].isdigit())):
            return value  # malformed: equal to no name, loopback or allowed
        return value[1:end]
    name, colon, port = value.rpartition(":")
    if colon and ":" not in name and (port.isdigit() or not port):
        value = name
    return value[:-1] if value.endswith(".") and value != "." else value


def normal_origin(value: str) -> str | None:
    """An origin as browsers serialise it (`http://localhost:3000`: lower-case scheme and host, no
    default port, no path), or None when `value` is not one."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


# --- paths ---------------------------------------------------------------------------------------


def default_config_path() -> Path:
    return Path(platformdirs.user_config_dir("omniroute")) / "config.toml"


def default_state_path() -> Path:
    return Path(platformdirs.user_data_dir("omniroute")) / "state.db"


def resolve_config_path(cli: str | None, env: Mapping[str, str]) -> Path:
    """`--config` > `OMNIROUTE_CONFIG` > the platform default. The first two count as explicit."""
    given = cli or env.get(CONFIG_PATH_ENV)
    return Path(given).expanduser() if given else default_config_path()


def resolve_state_path(cli: str | None, env: Mapping[str, str]) -> Path:
    """`--state` > `OMNIROUTE_STATE` > the platform default."""
    given = cli or env.get(STATE_PATH_ENV)
    return Path(given).expanduser() if given else default_state_path()


# --- loading -------------------------------------------------------------------------------------


def embedded_default() -> Config:
    """What runs without a config file: the built-in local servers, one keyless connection each."""
    providers = {
        pid: ProviderConfig(
            id=pid,
            provider_class="local",
            base_url=url,
            connections=(
                ConnectionConfig(
                    id=f"{pid}-1", provider=pid, name=f"{pid}-1", api_key=None, api_key_env=None
                ),
            ),
            per_model_quota=True,
            rate_limit=None,
            restate=(),
            headers=MappingProxyType({}),
            apis=builtin_apis(pid),
        )
        for pid, url in BUILTIN_LOCAL_PROVIDERS.items()
    }
    return Config(ServerConfig(), MappingProxyType(providers), MappingProxyType({}), source=None)


def load_config(path: Path | None, env: Mapping[str, str] = os.environ, *, explicit: bool = False) -> Config:
    """Read the config file at `path`, or fall back to the embedded default.

    `explicit` says the path came from `--config` or `OMNIROUTE_CONFIG` (use `resolve_config_path`'s rule:
    `explicit = bool(cli or env.get("OMNIROUTE_CONFIG"))`). A missing default file means "run on the embedded
    default"; a missing explicit file is an error. `env` resolves `api_key_env` and
    `OMNIROUTE_MANAGEMENT_TOKEN` (which wins over the file). Raises ConfigError naming every problem.
    """
    if path is None or (not explicit and not path.exists()):
        config = embedded_default()
        return _with_env_state(replace(config, server=_with_env_token(config.server, env)), env, path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(path, ["no such file"]) from None
    except IsADirectoryError:
        raise ConfigError(path, ["is a directory, not a config file"]) from None
    except OSError as e:
        raise ConfigError(path, [f"cannot read: {e.strerror or e}"]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(path, [f"line {line}: not UTF-8 text (byte {e.start})"]) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, [_toml_error(str(e))]) from None
    except RecursionError:  # arrays or inline tables nested deeper than the parser goes
        raise ConfigError(
            path, [Problem("values nested too deeply to read (invalid TOML for omniroute)")]
        ) from None
    except ValueError as e:  # tomllib's int() of more digits than CPython converts (4,300)
        raise ConfigError(path, [Problem(f"a value tomllib cannot read: {str(e)[:120]}")]) from None
    reader = _Reader(env)
    config = reader.config(doc, path)
    if reader.problems:
        lines = _key_lines(text)
        raise ConfigError(path, [replace(p, line=_line_of(p.key, lines)) for p in reader.problems], config)
    exposure = _exposure_warnings(config, path, reader.inline_secrets)
    nothing = [NO_PROVIDERS] if not config.providers else []
    warnings = [f"{path}: {w}" for w in (*reader.warnings, *exposure, *_unscrubbable(config), *nothing)]
    return _with_env_state(replace(config, warnings=tuple(warnings)), env, path)


def check_config(path: Path | None, env: Mapping[str, str] = os.environ, *, explicit: bool = False) -> Config:
    """`load_config`, and then everything `omniroute serve` would refuse to start with as the file
    stands (`refusals`): what `omniroute config check` runs. ConfigError names every problem."""
    try:
        config = load_config(path, env, explicit=explicit)
    except ConfigError as error:
        raise error.with_refusals() from None
    refusals = config.refusals()
    if refusals:
        text = _read_text(config.source)
        lines = _key_lines(text) if text is not None else {}
        raise ConfigError(config.source, [replace(p, line=_line_of(p.key, lines)) for p in refusals])
    return config


def _read_text(path: Path | None) -> str | None:
    try:
        return path.read_text(encoding="utf-8") if path is not None else None
    except (OSError, UnicodeDecodeError):
        return None


def _toml_error(message: str) -> Problem:
    m = _TOML_ERROR_RE.match(message)
    if m:
        return Problem(f"{m['msg']} (column {m['col']}; invalid TOML)", line=int(m["line"]))
    return Problem(f"{message} (invalid TOML)")


_HEADER_RE = re.compile(r"^\s*(\[\[?)\s*(?P<name>[^\]]+?)\s*\]\]?\s*(#.*)?$")
_ASSIGN_RE = re.compile(r"^\s*(?P<name>[A-Za-z0-9_\-.\"' ]+?)\s*=")


def _toml_key(text: str) -> list[str]:
    """The parts of a dotted TOML key (`providers."my.id".class`), quotes removed."""
    parts: list[str] = []
    current = ""
    quote = ""
    for ch in text.strip():
        if quote:
            if ch == quote:
                quote = ""
            else:
                current += ch
        elif ch in "\"'":
            quote = ch
        elif ch == ".":
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    return parts


def _key_lines(text: str) -> dict[str, int]:
    """Where each table and key of a TOML text is written, by the dotted names `Problem.key` uses
    (`providers.x.connections[1].id`): the first line that defines it. A line scanner, not a
    parser: good for the files people write, silent (no entry) where it cannot tell."""
    found: dict[str, int] = {}
    arrays: dict[str, int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER_RE.match(line)
        if header is not None:
            name = ".".join(_toml_key(header["name"]))
            if header.group(1) == "[[":
                index = arrays.get(name, -1) + 1
                arrays[name] = index
                name = f"{name}[{index}]"
            else:
                # A table inside an array of tables belongs to its latest element.
                for array, index in sorted(arrays.items(), key=lambda item: -len(item[0])):
                    if name.startswith(array + "."):
                        name = f"{array}[{index}]{name[len(array) :]}"
                        break
            table = name
            found.setdefault(name, number)
            continue
        assign = _ASSIGN_RE.match(line)
        if assign is not None:
            key = ".".join(_toml_key(assign["name"]))
            found.setdefault(f"{table}.{key}" if table else key, number)
    return found


def _line_of(key: str | None, lines: Mapping[str, int]) -> int | None:
    """The line of `key`, or of the nearest enclosing key or table that is written in the file."""
    while key:
        if key in lines:
            return lines[key]
        key = key[: key.rfind("[")] if key.endswith("]") else key.rpartition(".")[0]
    return None


def state_backend_problem(value: str) -> str | None:
    """Why `value` is not a state backend (`sqlite`, or a redis://, rediss:// or unix:// URL), or None."""
    if value == "sqlite":
        return None
    parts = urlsplit(value)
    if parts.scheme not in _REDIS_SCHEMES or not (parts.netloc or parts.path):
        return f"must be 'sqlite' or a Redis URL such as redis://127.0.0.1:6379/0 (got {_shown(value)})"
    return None


def _with_env_state(config: Config, env: Mapping[str, str], path: Path | None) -> Config:
    """`OMNIROUTE_STATE_BACKEND` wins over `[state] backend`, as the token's variable wins over the file."""
    value = env.get(STATE_BACKEND_ENV)
    if not value:
        return config
    problem = state_backend_problem(value)
    if problem is not None:
        raise ConfigError(path, [Problem(f"{STATE_BACKEND_ENV} {problem}")])
    return replace(config, state=replace(config.state, backend=value))


def _with_env_token(server: ServerConfig, env: Mapping[str, str]) -> ServerConfig:
    token = env.get(MANAGEMENT_TOKEN_ENV)
    return replace(server, management_token=token) if token else server


NO_PROVIDERS = (
    "no providers are configured: every /v1 request is answered 404 model_not_found"
    " (add a [providers.NAME] table; docs/configuration.md)"
)


def _exposure_warnings(config: Config, path: Path, inline_secrets: Sequence[str]) -> list[str]:
    warnings = []
    mode = _mode(path)
    # Windows reports no meaningful group/other bits, so the check would always fire there.
    if inline_secrets and mode is not None and mode & 0o077 and os.name != "nt":
        warnings.append(
            f"holds secrets inline ({', '.join(inline_secrets)}) but others can read it (mode {mode:04o}): "
            f"run `chmod 600 {path}`, or use api_key_env / {MANAGEMENT_TOKEN_ENV}"
        )
    return warnings


def _unscrubbable(config: Config) -> list[str]:
    """Secrets too short to be scrubbed: a short string is found in too much else (the scrubber
    takes secrets of MIN_SECRET_LENGTH characters and up), so an upstream that echoes one shows it."""
    short = [
        f"providers.{c.provider}.connections[{i}].api_key"
        for p in config.providers.values()
        for i, c in enumerate(p.connections)
        if c.api_key and len(c.api_key) < MIN_SECRET_LENGTH
    ]
    short += [
        f"server.api_keys[{i}]" for i, k in enumerate(config.server.api_keys) if len(k) < MIN_SECRET_LENGTH
    ]
    if config.server.management_token and len(config.server.management_token) < MIN_SECRET_LENGTH:
        short.append("server.management_token")
    short += [
        f"providers.{p.id}.base_url's password"
        for p in config.providers.values()
        if any(len(secret) < MIN_SECRET_LENGTH for secret in _url_secrets(p.base_url))
    ]
    return [
        f"{where}: shorter than {MIN_SECRET_LENGTH} characters, so it is not scrubbed from what is shown"
        " (an upstream that echoes it shows it); a dummy key for a local server may be ignored"
        for where in short
    ]


def _mode(path: Path) -> int | None:
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return None


# --- the reader ----------------------------------------------------------------------------------


def _has_control(text: str) -> bool:
    """Control or format characters (ESC, newline, tab, bidi overrides, zero-width): a name holding
    one would rewrite the terminal it is shown on, or read as another name."""
    return not text.isprintable() and any(unicodedata.category(ch) in ("Cc", "Cf") for ch in text)


def shown_url(url: str, *, query: bool = True) -> str:
    """A URL as the program shows it: without the user name and password it may carry (a
    base_url's are sent upstream as HTTP Basic credentials, a Redis URL's is its password), and
    with `query=False` without its query either (where a key may be too)."""
    parts = urlsplit(url)
    kept = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    if not query:
        kept = kept._replace(query="", fragment="")
    return url if kept == parts else urlunsplit(kept)


def _url_said(value: str) -> str:
    """A refused URL quoted in a problem: without user name, password or query."""
    try:
        parts = urlsplit(value)
        shown = shown_url(value, query=False)
    except ValueError:
        return "a URL that cannot be read"
    return _shown(shown + ("?…" if parts.query or parts.fragment else ""))


def _shown(value: str) -> str:
    """A config value quoted for a problem message: escaped (repr) and short."""
    return repr(value[:60]) + ("…" if len(value) > 60 else "")


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return "a date/time"


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# A table's keys are its dataclass's fields, and a key's default is the field's: written once, in
# the dataclass. The checks stay per key, since each has its own message (see the module's opening).


def _keys_of(cls: type[DataclassInstance], *, but: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in but)


def _defaults_of(cls: type[DataclassInstance]) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


class _Reader:
    """Walks the parsed TOML document, building dataclasses and collecting every problem on the way.

    Getters record a problem and return a fallback value instead of raising, so one pass reports
    everything; `load_config` raises if anything was recorded, so fallback values never escape."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[Problem] = []
        self.warnings: list[str] = []
        self.inline_secrets: list[str] = []
        """Where the file itself holds a secret (for the file-mode warning)."""

    def problem(self, key: str, message: str) -> None:
        self.problems.append(Problem(message, key))

    # typed getters ---------------------------------------------------------------------------

    def keys(self, table: Mapping[str, Any], where: str, allowed: Sequence[str]) -> None:
        for name in table:
            if name not in allowed:
                close = difflib.get_close_matches(name, allowed, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(allowed)})"
                self.problem(_join(where, name), f"unknown key{hint}")

    def table(self, value: object, key: str) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        self.problem(key, f"must be a table (got {_kind(value)})")
        return {}

    def str_(self, t: Mapping[str, Any], where: str, name: str, *, required: bool = False) -> str | None:
        key = _join(where, name)
        if name not in t:
            if required:
                self.problem(key, "missing (required)")
            return None
        value = t[name]
        if not isinstance(value, str):
            self.problem(key, f"must be a string (got {_kind(value)})")
            return None
        if not value.strip():
            self.problem(key, "must not be empty")
            return None
        return value

    def int_(self, t: Mapping[str, Any], where: str, name: str, default: int, lo: int, hi: int) -> int:
        value = t.get(name, default)
        if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
            return value
        got = _kind(value)
        if isinstance(value, int) and not isinstance(value, bool):
            # (Thousands of digits cannot be written out: CPython refuses past 4,300 of them.)
            got = str(value) if value.bit_length() <= 64 else "an integer far out of range"
        self.problem(_join(where, name), f"must be an integer between {lo:,} and {hi:,} (got {got})")
        return default

    def bool_(self, t: Mapping[str, Any], where: str, name: str, default: bool) -> bool:
        value = t.get(name, default)
        if isinstance(value, bool):
            return value
        self.problem(_join(where, name), f"must be true or false (got {_kind(value)})")
        return default

    def str_list(self, t: Mapping[str, Any], where: str, name: str) -> tuple[str, ...]:
        key = _join(where, name)
        value = t.get(name, [])
        if not isinstance(value, list):
            self.problem(key, f"must be an array of strings (got {_kind(value)})")
            return ()
        items: list[str] = []
        for i, item in enumerate(value):
            if isinstance(item, str) and item.strip():
                items.append(item)
            else:
                what = "an empty string" if isinstance(item, str) else _kind(item)
                self.problem(f"{key}[{i}]", f"must be a non-empty string (got {what})")
        return tuple(items)

    def name(self, t: Mapping[str, Any], where: str) -> str | None:
        """A display name: any printable text, so that it reads the same on every screen."""
        value = self.str_(t, where, "name")
        if value is not None and _has_control(value):
            self.problem(_join(where, "name"), f"must not contain control characters (got {_shown(value)})")
            return None
        return value

    def ident(self, value: str, key: str, what: str) -> None:
        if not _ID_RE.fullmatch(value):
            self.problem(
                key,
                f"{what} {_shown(value)} must start with a letter or digit "
                "and use only letters, digits, '.', '_' and '-'",
            )

    # sections --------------------------------------------------------------------------------

    def config(self, doc: Mapping[str, Any], path: Path) -> Config:
        self.keys(doc, "", ("server", "providers", "combos", "state"))
        server_table = self.table(doc.get("server", {}), "server")
        state = self.state(self.table(doc.get("state", {}), "state"))
        providers_table = self.table(doc.get("providers", {}), "providers")
        combos_table = self.table(doc.get("combos", {}), "combos")

        server = self.server(server_table, combos_table)
        seen_connections: dict[str, str] = {}
        providers = {pid: self.provider(pid, raw, seen_connections) for pid, raw in providers_table.items()}
        combos = {name: self.combo(name, raw, providers_table) for name, raw in combos_table.items()}
        return Config(server, MappingProxyType(providers), MappingProxyType(combos), source=path, state=state)

    def state(self, t: Mapping[str, Any]) -> StateConfig:
        w = "state"
        self.keys(t, w, _keys_of(StateConfig))
        d = StateConfig()
        backend = self.str_(t, w, "backend") or d.backend
        problem = state_backend_problem(backend)
        if problem is not None:
            self.problem(f"{w}.backend", problem)
        prefix = self.str_(t, w, "key_prefix") or d.key_prefix
        if _has_control(prefix) or " " in prefix:
            self.problem(f"{w}.key_prefix", "must not contain spaces or control characters")
        return StateConfig(backend=backend, key_prefix=prefix)

    def server(self, t: Mapping[str, Any], combos: Mapping[str, Any]) -> ServerConfig:
        w = "server"
        self.keys(t, w, _keys_of(ServerConfig))
        default_combo = self.str_(t, w, "default_combo")
        if default_combo is not None and default_combo not in combos:
            known = ", ".join(combos) or "none defined"
            self.problem(f"{w}.default_combo", f"names unknown combo '{default_combo}' (combos: {known})")
        d = ServerConfig()  # slotted dataclass: defaults live on an instance, not on the class
        server = ServerConfig(
            host=self.str_(t, w, "host") or d.host,
            port=self.int_(t, w, "port", d.port, 1, 65_535),
            management_token=self.str_(t, w, "management_token"),
            api_keys=self.str_list(t, w, "api_keys"),
            default_combo=default_combo,
            connect_timeout_ms=self.int_(t, w, "connect_timeout_ms", d.connect_timeout_ms, *_TIMEOUT_RANGE),
            first_byte_timeout_ms=self.int_(
                t, w, "first_byte_timeout_ms", d.first_byte_timeout_ms, *_TIMEOUT_RANGE
            ),
            idle_timeout_ms=self.int_(t, w, "idle_timeout_ms", d.idle_timeout_ms, *_TIMEOUT_RANGE),
            allowed_hosts=self.hosts(t, w),
            allowed_origins=self.origins(t, w),
            request_history=self.int_(t, w, "request_history", d.request_history, 0, REQUEST_HISTORY_MAX),
        )
        if server.management_token:
            self.inline_secrets.append("server.management_token")
        if server.api_keys:
            self.inline_secrets.append("server.api_keys")
        # Clients send these in a header; one that cannot travel there is refused by name, not shown.
        for i, key in enumerate(server.api_keys):
            if not sendable_secret(key):
                self.problem(f"{w}.api_keys[{i}]", f"the key {UNSENDABLE_SECRET}")
        server = _with_env_token(server, self.env)
        if server.management_token and not sendable_secret(server.management_token):
            from_env = self.env.get(MANAGEMENT_TOKEN_ENV)
            self.problem(
                MANAGEMENT_TOKEN_ENV if from_env else f"{w}.management_token",
                f"the token {UNSENDABLE_SECRET}",
            )
        return server

    def hosts(self, t: Mapping[str, Any], w: str) -> tuple[str, ...]:
        """`allowed_hosts`: names or addresses a `Host` header may carry (any port)."""
        hosts = []
        for i, value in enumerate(self.str_list(t, w, "allowed_hosts")):
            name = host_name(value)
            if "*" in value or "?" in value:
                # A Host is compared whole: a pattern would match nothing, silently.
                self.problem(
                    f"{w}.allowed_hosts[{i}]",
                    f"wildcards are not supported: list each host name or address (got {_shown(value)})",
                )
            elif not name or any(c in name for c in "/@ \t") or _has_control(name):
                self.problem(
                    f"{w}.allowed_hosts[{i}]",
                    f"must be a host name or address such as 'proxy.lan' or '192.168.1.20' (got {_shown(value)})",
                )
            else:
                hosts.append(name)
        return tuple(hosts)

    def origins(self, t: Mapping[str, Any], w: str) -> tuple[str, ...]:
        """`allowed_origins`: exact browser origins, as a browser writes them in `Origin`."""
        origins = []
        for i, value in enumerate(self.str_list(t, w, "allowed_origins")):
            origin = normal_origin(value)
            if origin is None:
                self.problem(
                    f"{w}.allowed_origins[{i}]",
                    "must be an origin such as 'http://localhost:3000' (scheme, host and port only)"
                    f" (got {_shown(value)})",
                )
            else:
                origins.append(origin)
        return tuple(origins)

    def provider(self, pid: str, raw: object, seen_connections: dict[str, str]) -> ProviderConfig:
        w = f"providers.{pid}"
        self.ident(pid, w, "provider id")
        t = self.table(raw, w)
        if not isinstance(raw, dict):  # e.g. `providers.x = 3`: say so once, not once per missing key
            return ProviderConfig(pid, "local", "", (), False, None, (), MappingProxyType({}))
        self.keys(
            t,
            w,
            (
                "class",
                "base_url",
                "apis",
                "auth",
                "connections",
                "per_model_quota",
                "rate_limit",
                "restate",
                "headers",
            ),
        )
        # The built-in local servers need neither `class` nor `base_url`: `[providers.ollama]` plus a
        # connection is enough, as in the embedded default.
        builtin_url = BUILTIN_LOCAL_PROVIDERS.get(pid)

        cls: ProviderClass = "local"
        raw_cls = t.get("class", "local" if builtin_url else None)
        if raw_cls is None:
            self.problem(f"{w}.class", "missing (required): one of local, apikey, oauth")
        elif raw_cls not in _CLASS_CHOICES:
            self.problem(f"{w}.class", f"must be one of local, apikey, oauth (got {raw_cls!r})")
        else:
            cls = raw_cls

        base_url = self.url(t, w) if "base_url" in t or not builtin_url else builtin_url
        connections = self.connections(t, w, pid, seen_connections)
        headers = self.headers(t, w)
        auth = self.auth(t, w)
        if "@" in urlsplit(base_url).netloc:
            # The URL's user name and password go upstream as `Authorization: Basic`: a request
            # cannot also carry a key there (every request failed inside the HTTP client).
            keyed = [c.id for c in connections if c.api_key] if auth == "bearer" else []
            if keyed or any(name.lower() == "authorization" for name in headers):
                also = f"connection {keyed[0]}'s api_key" if keyed else f"{w}.headers.Authorization"
                self.problem(
                    f"{w}.base_url",
                    "holds a user name and password, which are sent as the Authorization header (HTTP"
                    f" Basic), and so is {also}: keep the credential in one of them",
                )
        per_model_quota = self.bool_(t, w, "per_model_quota", cls == "local")
        rate_limit = self.bool_(t, w, "rate_limit", False) if "rate_limit" in t else None
        return ProviderConfig(
            id=pid,
            provider_class=cls,
            base_url=base_url,
            connections=connections,
            per_model_quota=per_model_quota,
            rate_limit=rate_limit,
            restate=self.restate(t, w),
            headers=headers,
            apis=self.apis(t, w, pid),
            auth=auth,
        )

    def apis(self, t: Mapping[str, Any], w: str, pid: str) -> frozenset[str]:
        """`apis`: the wire APIs the provider answers; a built-in local server knows its own."""
        if "apis" not in t:
            return builtin_apis(pid)
        key = f"{w}.apis"
        if t["apis"] == []:
            self.problem(key, f"must list at least one of {', '.join(API_NAMES)}")
            return frozenset()
        names = self.str_list(t, w, "apis")
        for i, name in enumerate(names):
            if name not in API_NAMES:
                close = difflib.get_close_matches(name, API_NAMES, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                self.problem(
                    f"{key}[{i}]", f"must be one of {', '.join(API_NAMES)} (got {_shown(name)}{hint})"
                )
        return frozenset(names)

    def auth(self, t: Mapping[str, Any], w: str) -> AuthStyle:
        value = t.get("auth", "bearer")
        for style in AUTH_STYLES:
            if value == style:
                return style
        got = _shown(value) if isinstance(value, str) else _kind(value)
        self.problem(f"{w}.auth", f"must be one of {', '.join(AUTH_STYLES)} (got {got})")
        return "bearer"

    def url(self, t: Mapping[str, Any], w: str) -> str:
        value = self.str_(t, w, "base_url", required=True)
        if value is None:
            return ""
        url = value.strip().rstrip("/")
        try:
            parts = urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
            ok = ok and not parts.query and not parts.fragment
            ok = ok and not any(c.isspace() for c in url) and not _has_control(url)
        except ValueError:  # a bad port or bracketed host
            ok = False
        if not ok:
            self.problem(
                f"{w}.base_url",
                "must be an http:// or https:// URL with a host, e.g. 'http://localhost:11434/v1' "
                f"(got {_url_said(value)})",
            )
        return url

    def connections(
        self, t: Mapping[str, Any], w: str, pid: str, seen: dict[str, str]
    ) -> tuple[ConnectionConfig, ...]:
        key = f"{w}.connections"
        raw = t.get("connections", [])
        if not isinstance(raw, list):
            self.problem(key, f"must be an array of tables, [[{key}]] (got {_kind(raw)})")
            return ()
        if not raw:
            self.problem(key, f"a provider needs at least one connection: add a [[{key}]] table with an id")
        return tuple(self.connection(item, f"{key}[{i}]", pid, seen) for i, item in enumerate(raw))

    def connection(self, raw: object, w: str, pid: str, seen: dict[str, str]) -> ConnectionConfig:
        t = self.table(raw, w)
        self.keys(t, w, _keys_of(ConnectionConfig, but=("provider",)))  # the table it sits in says that
        cid = self.str_(t, w, "id", required=True) or ""
        if cid:
            self.ident(cid, f"{w}.id", "connection id")
            if cid in seen:
                self.problem(f"{w}.id", f"duplicate connection id '{cid}' (already used at {seen[cid]})")
            else:
                seen[cid] = f"{w}.id"

        api_key = self.str_(t, w, "api_key")
        api_key_env = self.str_(t, w, "api_key_env")
        if api_key_env is not None and not _ENV_NAME_RE.fullmatch(api_key_env):
            self.problem(f"{w}.api_key_env", f"must be an environment variable name (got {api_key_env!r})")
        if api_key is not None and api_key_env is not None:
            self.problem(w, "set api_key or api_key_env, not both")
        resolved = api_key
        if api_key is not None:
            self.inline_secrets.append(f"{w}.api_key")
        if api_key_env is not None and api_key is None:
            resolved = self.env.get(api_key_env) or None
            if resolved is None:
                self.warnings.append(
                    f"{w}.api_key_env: {api_key_env} is not set, so connection '{cid}' sends no key"
                )
        if resolved is not None and not sendable_secret(resolved):
            # Named, never shown: it is a secret.
            where = f"{w}.api_key" if api_key is not None else f"{w}.api_key_env ({api_key_env})"
            self.problem(where, f"connection '{cid}': the key {UNSENDABLE_SECRET}")

        max_concurrent = None
        if "max_concurrent" in t:
            max_concurrent = self.int_(t, w, "max_concurrent", 1, 1, 10_000)
        d = _defaults_of(ConnectionConfig)
        return ConnectionConfig(
            id=cid,
            provider=pid,
            name=self.name(t, w) or cid,
            api_key=resolved,
            api_key_env=api_key_env,
            priority=self.int_(t, w, "priority", d["priority"], 0, 1_000_000),
            max_concurrent=max_concurrent,
            enabled=self.bool_(t, w, "enabled", d["enabled"]),
            disable_cooling=self.bool_(t, w, "disable_cooling", d["disable_cooling"]),
        )

    def restate(self, t: Mapping[str, Any], w: str) -> tuple[RestatementRule, ...]:
        key = f"{w}.restate"
        raw = t.get("restate", [])
        if not isinstance(raw, list):
            self.problem(key, f"must be an array of tables, [[{key}]] (got {_kind(raw)})")
            return ()
        rules = []
        first_at: dict[str, int] = {}
        for i, item in enumerate(raw):
            rule_key = f"{key}[{i}]"
            rule = self.table(item, rule_key)
            before = len(self.problems)
            self.keys(rule, rule_key, ("id", "from", "to", "markers", "exclude", "retry_after_ms"))
            if len(self.problems) > before:
                continue  # rule_from_config would only repeat the unknown-key complaint
            try:
                built = rule_from_config(rule)
            except ValueError as e:
                self.problem(rule_key, str(e))
                continue
            # Events and logs name a restatement by its rule's id, and an id overrides the built-in
            # rule of that id: one id for two rules would be one name for two behaviours.
            if built.id in first_at:
                self.problem(
                    f"{rule_key}.id", f"{built.id!r} is already the id of restate[{first_at[built.id]}]"
                )
                continue
            first_at[built.id] = i
            rules.append(built)
        return tuple(rules)

    def headers(self, t: Mapping[str, Any], w: str) -> Mapping[str, str]:
        key = f"{w}.headers"
        raw = self.table(t.get("headers", {}), key)
        headers = {}
        for name, value in raw.items():
            if not _HEADER_NAME_RE.fullmatch(name):
                self.problem(f"{key}.{name}", "is not a valid HTTP header name")
            elif not isinstance(value, str):
                self.problem(f"{key}.{name}", f"must be a string (got {_kind(value)})")
            elif any(c in value for c in "\r\n\0"):
                self.problem(f"{key}.{name}", "must not contain line breaks or NUL")
            else:
                headers[name] = value
        return MappingProxyType(headers)

    def combo(self, name: str, raw: object, providers: Mapping[str, Any]) -> ComboConfig:
        w = f"combos.{name}"
        self.ident(name, w, "combo name")
        t = self.table(raw, w)
        self.keys(t, w, ("strategy", "targets"))
        strategy: ComboStrategy = "priority"
        raw_strategy = t.get("strategy", "priority")
        if raw_strategy in _STRATEGIES:
            strategy = raw_strategy
        else:
            self.problem(f"{w}.strategy", f"must be one of priority, round-robin (got {raw_strategy!r})")
        if "targets" not in t:
            self.problem(f"{w}.targets", 'missing (required): e.g. ["ollama/qwen2.5-coder:7b"]')
        elif t["targets"] == []:
            self.problem(f"{w}.targets", "must list at least one provider/model")
        targets = self.str_list(t, w, "targets")
        for i, target in enumerate(targets):
            provider, slash, model = target.partition("/")
            if not slash or not provider or not model:
                self.problem(f"{w}.targets[{i}]", f"must be provider/model (got {target!r})")
            elif provider not in providers:
                known = ", ".join(providers) or "none configured"
                self.problem(f"{w}.targets[{i}]", f"names unknown provider '{provider}' (providers: {known})")
        return ComboConfig(name, strategy, targets)


# --- the starter file ----------------------------------------------------------------------------


def _toml_str(value: str) -> str:
    """A TOML basic string: escapes what TOML requires (quote, backslash, control characters)."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def render_starter_config(detected: Mapping[str, str]) -> str:
    """The text `omniroute config init` writes: the local servers found (id -> base_url) as live
    providers, the other built-ins and an API-key provider as commented examples. When nothing was
    detected, every built-in is written live, matching the embedded default."""
    for pid in detected:
        if not _ID_RE.fullmatch(pid):
            raise ValueError(f"not a valid provider id: {pid!r}")
    live = dict(detected) if detected else dict(BUILTIN_LOCAL_PROVIDERS)
    lines = [
        "# omniroute config: every key is in docs/configuration.md.",
        "",
        "[server]",
        'host = "127.0.0.1"          # a non-loopback host requires management_token and api_keys',
        "port = 20128",
        '# management_token = "..."  # or env OMNIROUTE_MANAGEMENT_TOKEN',
        '# api_keys = ["sk-local-..."]  # when set, /v1/* requires one as a Bearer token',
        '# default_combo = "coding"   # used for a bare model name that no provider claims',
        "",
    ]
    if not detected:
        lines += ["# No local server answered when this file was written; these are the usual addresses.", ""]
    for pid, url in live.items():
        lines += [
            f"[providers.{pid}]",
            'class = "local"              # local | apikey | oauth',
            f"base_url = {_toml_str(url)}",
            "# per_model_quota = true     # default: true for local",
            "",
            f"[[providers.{pid}.connections]]",
            f'id = "{pid}-1"',
            "# max_concurrent = 1        # the server's real concurrency (e.g. llama.cpp slots)",
            "",
        ]
    for pid, url in BUILTIN_LOCAL_PROVIDERS.items():
        if pid not in live:
            lines += [
                f"# [providers.{pid}]",
                '# class = "local"',
                f"# base_url = {_toml_str(url)}",
                f"# [[providers.{pid}.connections]]",
                f'# id = "{pid}-1"',
                "",
            ]
    lines += [
        "# An API-key provider:",
        "# [providers.openai]",
        '# class = "apikey"',
        '# base_url = "https://api.openai.com/v1"',
        "# [[providers.openai.connections]]",
        '# id = "openai-main"',
        '# api_key_env = "OPENAI_API_KEY"   # or api_key = "..." (then keep this file mode 0600)',
        "# priority = 1",
        "# max_concurrent = 4",
        "",
        "# Anthropic's API, for Claude Code (ANTHROPIC_BASE_URL=http://127.0.0.1:20128):",
        "# [providers.anthropic]",
        '# class = "apikey"',
        '# base_url = "https://api.anthropic.com/v1"',
        '# apis = ["messages"]               # chat, completions, embeddings, responses, messages',
        '# auth = "x-api-key"                # the key as x-api-key, as Anthropic wants it',
        "# [[providers.anthropic.connections]]",
        '# id = "claude-main"',
        '# api_key_env = "ANTHROPIC_API_KEY"',
        "",
        "# A combo: a model name that tries its targets in order.",
        "# [combos.coding]",
        '# strategy = "priority"        # priority | round-robin',
        f'# targets = ["{next(iter(live))}/MODEL", "openai/gpt-4o-mini"]',
        "",
    ]
    return "\n".join(lines)
