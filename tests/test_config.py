from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from proxy import serve
from proxy.config import (
    BUILTIN_LOCAL_PROVIDERS,
    NO_PROVIDERS,
    ConfigError,
    ConnectionConfig,
    ServerConfig,
    check_config,
    default_config_path,
    default_state_path,
    embedded_default,
    load_config,
    render_starter_config,
    resolve_config_path,
    resolve_state_path,
)

FULL_EXAMPLE = """
[server]
host = "127.0.0.1"
port = 20200
management_token = "mgmt-token-123"
api_keys = ["sk-local-aaa", "sk-local-bbb"]
default_combo = "coding"
connect_timeout_ms = 5000
first_byte_timeout_ms = 60000
idle_timeout_ms = 30000

[providers.ollama]
class = "local"
base_url = "http://localhost:11434/v1/"

[[providers.ollama.connections]]
id = "ollama-1"
max_concurrent = 1

[providers.openai]
class = "apikey"
base_url = "https://api.openai.com/v1"
per_model_quota = true
rate_limit = false

[providers.openai.headers]
OpenAI-Organization = "org-42"

[[providers.openai.restate]]
id = "quota-403"
from = [403]
to = 429
markers = ["quota"]
exclude = ["forbidden"]
retry_after_ms = 30000

[[providers.openai.connections]]
id = "openai-main"
api_key_env = "OPENAI_API_KEY"
priority = 1
max_concurrent = 4

[[providers.openai.connections]]
id = "openai-spare"
name = "Spare key"
api_key = "sk-spare-0123456789wxyz"
priority = 2
enabled = false
disable_cooling = true

[combos.coding]
strategy = "priority"
targets = ["ollama/qwen2.5-coder:7b", "openai/gpt-4o-mini"]

[combos.spread]
strategy = "round-robin"
targets = ["openai/gpt-4o"]
"""

MINIMAL_PROVIDER = """
[providers.openai]
class = "apikey"
base_url = "https://api.openai.com/v1"

[[providers.openai.connections]]
id = "openai-main"
"""


def write(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


def error_for(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, {}, explicit=True)
    return str(info.value)


# --- the embedded default ------------------------------------------------------------------------


def test_embedded_default_has_the_four_local_servers() -> None:
    config = embedded_default()
    assert list(config.providers) == ["ollama", "lmstudio", "llamacpp", "vllm"]
    assert config.providers["llamacpp"].base_url == "http://127.0.0.1:8080/v1"
    assert config.providers["ollama"].base_url == "http://localhost:11434/v1"
    for pid, provider in config.providers.items():
        assert provider.provider_class == "local"
        assert provider.per_model_quota is True
        assert provider.rate_limit is None
        assert [c.id for c in provider.connections] == [f"{pid}-1"]
        assert provider.connections[0].api_key is None
    assert (config.server.host, config.server.port) == ("127.0.0.1", 20128)
    assert config.server.management_token is None
    assert config.combos == {}
    assert config.source is None
    assert config.warnings == ()
    conn = config.connection("vllm-1")
    assert conn is not None and conn.provider == "vllm"
    assert config.connection("nope") is None


def test_builtin_local_servers_speak_what_their_docs_say_and_others_speak_openais_three() -> None:
    config = embedded_default()
    base = {"chat", "completions", "embeddings"}
    assert config.providers["ollama"].apis == base | {"responses", "messages"}
    assert config.providers["lmstudio"].apis == base | {"responses", "messages"}
    assert config.providers["vllm"].apis == base | {"responses", "messages"}
    assert config.providers["llamacpp"].apis == base | {"messages"}
    assert all(p.auth == "bearer" for p in config.providers.values())


def test_apis_and_auth_are_read(tmp_path: Path) -> None:
    text = (
        '[providers.anthropic]\nclass = "apikey"\nbase_url = "https://api.anthropic.com/v1"\n'
        'apis = ["messages"]\nauth = "x-api-key"\n[[providers.anthropic.connections]]\nid = "c"\n'
        '[providers.openai]\nclass = "apikey"\nbase_url = "https://api.openai.com/v1"\n'
        '[[providers.openai.connections]]\nid = "o"\n'
        '[providers.ollama]\napis = ["chat"]\n[[providers.ollama.connections]]\nid = "l"\n'
    )
    config = load_config(write(tmp_path, text), {}, explicit=True)
    assert config.providers["anthropic"].apis == {"messages"}
    assert config.providers["anthropic"].auth == "x-api-key"
    assert config.providers["openai"].apis == {"chat", "completions", "embeddings"}
    assert config.providers["openai"].auth == "bearer"
    assert config.providers["ollama"].apis == {"chat"}  # what the file says wins over the built-in


def test_missing_default_file_falls_back_to_the_embedded_default(tmp_path: Path) -> None:
    assert load_config(None, {}).providers.keys() == embedded_default().providers.keys()
    config = load_config(tmp_path / "absent.toml", {}, explicit=False)
    assert config.source is None
    assert list(config.providers) == list(BUILTIN_LOCAL_PROVIDERS)


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path, {}, explicit=True)
    assert str(info.value) == f"{path}: no such file"


def test_env_management_token_wins_over_file_and_default(tmp_path: Path) -> None:
    env = {"OMNIROUTE_MANAGEMENT_TOKEN": "from-env"}
    assert load_config(None, env).server.management_token == "from-env"
    path = write(tmp_path, '[server]\nmanagement_token = "from-file"\n')
    assert load_config(path, env).server.management_token == "from-env"
    assert load_config(path, {}).server.management_token == "from-file"


# --- a full file ---------------------------------------------------------------------------------


def test_full_example_loads_every_field(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_EXAMPLE)
    config = load_config(path, {"OPENAI_API_KEY": "sk-proj-abcdefghijklmnop"}, explicit=True)

    assert config.source == path
    assert config.warnings == ()
    assert config.server == ServerConfig(
        host="127.0.0.1",
        port=20200,
        management_token="mgmt-token-123",
        api_keys=("sk-local-aaa", "sk-local-bbb"),
        default_combo="coding",
        connect_timeout_ms=5000,
        first_byte_timeout_ms=60000,
        idle_timeout_ms=30000,
    )

    ollama = config.providers["ollama"]
    assert ollama.provider_class == "local"
    assert ollama.base_url == "http://localhost:11434/v1"  # trailing slash dropped
    assert ollama.per_model_quota is True
    assert ollama.rate_limit is None
    assert ollama.restate == ()
    assert ollama.headers == {}
    assert ollama.connections == (
        ConnectionConfig(
            id="ollama-1",
            provider="ollama",
            name="ollama-1",
            api_key=None,
            api_key_env=None,
            max_concurrent=1,
        ),
    )

    openai = config.providers["openai"]
    assert openai.provider_class == "apikey"
    assert openai.base_url == "https://api.openai.com/v1"
    assert openai.per_model_quota is True
    assert openai.rate_limit is False
    assert dict(openai.headers) == {"OpenAI-Organization": "org-42"}
    assert len(openai.restate) == 1
    rule = openai.restate[0]
    assert (rule.id, rule.from_statuses, rule.to_status) == ("quota-403", (403,), 429)
    assert (rule.markers, rule.exclude, rule.retry_after_ms) == (("quota",), ("forbidden",), 30000)
    main, spare = openai.connections
    assert main == ConnectionConfig(
        id="openai-main",
        provider="openai",
        name="openai-main",
        api_key="sk-proj-abcdefghijklmnop",
        api_key_env="OPENAI_API_KEY",
        priority=1,
        max_concurrent=4,
    )
    assert spare == ConnectionConfig(
        id="openai-spare",
        provider="openai",
        name="Spare key",
        api_key="sk-spare-0123456789wxyz",
        api_key_env=None,
        priority=2,
        enabled=False,
        disable_cooling=True,
    )
    assert config.connection("openai-spare") is spare

    assert list(config.combos) == ["coding", "spread"]
    coding = config.combos["coding"]
    assert (coding.name, coding.strategy) == ("coding", "priority")
    assert coding.targets == ("ollama/qwen2.5-coder:7b", "openai/gpt-4o-mini")
    assert config.combos["spread"].strategy == "round-robin"


def test_builtin_local_provider_needs_neither_class_nor_base_url(tmp_path: Path) -> None:
    path = write(tmp_path, '[[providers.llamacpp.connections]]\nid = "slot"\n')
    provider = load_config(path, {}).providers["llamacpp"]
    assert (provider.provider_class, provider.base_url) == ("local", "http://127.0.0.1:8080/v1")


def test_defaults_for_an_apikey_provider(tmp_path: Path) -> None:
    provider = load_config(write(tmp_path, MINIMAL_PROVIDER), {}).providers["openai"]
    assert provider.per_model_quota is False
    assert provider.rate_limit is None
    conn = provider.connections[0]
    assert (conn.name, conn.priority, conn.max_concurrent, conn.enabled, conn.disable_cooling) == (
        "openai-main",
        100,
        None,
        True,
        False,
    )


# --- keys and secrets ----------------------------------------------------------------------------


def test_api_key_env_is_resolved_from_the_given_env(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_PROVIDER + 'api_key_env = "MY_KEY"\n')
    conn = load_config(path, {"MY_KEY": "sk-from-env-9876"}).providers["openai"].connections[0]
    assert (conn.api_key, conn.api_key_env) == ("sk-from-env-9876", "MY_KEY")


@pytest.mark.parametrize(
    ("line", "env"),
    [
        ('api_key_env = "MY_KEY"\n', {"MY_KEY": "sk-from-env-5555\n"}),  # an EnvironmentFile's newline
        ('api_key_env = "MY_KEY"\n', {"MY_KEY": "sk-from-env-5555\r"}),
        ('api_key = "sk-inline-5555\\n"\n', {}),
        ('api_key = "sk-inline 5555"\n', {}),
        ('api_key = "sk-inline-5555\u00e9"\n', {}),
    ],
)
def test_a_key_that_cannot_go_in_a_header_is_refused_by_name_and_never_shown(
    tmp_path: Path, line: str, env: dict[str, str]
) -> None:
    """It is sent as a header value: a trailing newline made every request on the connection fail
    with a 500, while `config check` said OK."""
    path = write(tmp_path, MINIMAL_PROVIDER + line)
    with pytest.raises(ConfigError) as info:
        load_config(path, env)
    text = str(info.value)
    assert "connection 'openai-main': the key holds" in text
    assert "5555" not in text


@pytest.mark.parametrize(
    ("text", "env", "where"),
    [
        ('[server]\nmanagement_token = "t0ken-5555\\r"\n', {}, "server.management_token"),
        ("", {"OMNIROUTE_MANAGEMENT_TOKEN": "t0ken-5555\r\n"}, "OMNIROUTE_MANAGEMENT_TOKEN"),
        ('[server]\nmanagement_token = "t0ken 5555"\n', {}, "server.management_token"),
        ('[server]\napi_keys = ["good-key-1", "sk-5555\\n"]\n', {}, "server.api_keys[1]"),
        ('[server]\napi_keys = ["sk-5555\u00e9"]\n', {}, "server.api_keys[0]"),
    ],
)
def test_a_server_secret_no_client_can_send_is_refused_by_name_and_never_shown(
    tmp_path: Path, text: str, env: dict[str, str], where: str
) -> None:
    """A client sends the management token and the API keys in a header, where a trailing newline or
    a space cannot travel: a token with one locked every client out of the management API, while
    `config check` said OK."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env)
    text = str(info.value)
    assert where in text and "printable ASCII" in text
    assert "5555" not in text


def test_unset_api_key_env_gives_no_key_and_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_PROVIDER + 'api_key_env = "MY_KEY"\n')
    config = load_config(path, {"MY_KEY": ""})
    assert config.providers["openai"].connections[0].api_key is None
    assert config.warnings == (
        f"{path}: providers.openai.connections[0].api_key_env: MY_KEY is not set, "
        "so connection 'openai-main' sends no key",
    )


def test_inline_key_in_a_world_readable_file_warns(tmp_path: Path) -> None:
    if os.name == "nt":
        pytest.skip("no POSIX modes")
    path = write(tmp_path, MINIMAL_PROVIDER + 'api_key = "sk-inline-0123456789"\n', mode=0o644)
    (warning,) = load_config(path, {}).warnings
    assert warning.startswith(f"{path}: holds secrets inline (providers.openai.connections[0].api_key)")
    assert "mode 0644" in warning
    assert f"chmod 600 {path}" in warning


def test_a_secret_too_short_to_scrub_is_warned_of_by_where_it_is_never_what_it_is(tmp_path: Path) -> None:
    """A 7-character key passed `config check` in silence, and an upstream that echoed it had it
    shown: the scrubber cannot take a string that short (it is found in too much else)."""
    text = '[server]\napi_keys = ["short12", "long-enough-key"]\nmanagement_token = "tok"\n'
    path = write(tmp_path, text + MINIMAL_PROVIDER + 'api_key = "Pw7x9Qz"\n', mode=0o600)
    warnings = load_config(path, {}).warnings
    assert [w.split(": ")[1] for w in warnings] == [
        "providers.openai.connections[0].api_key",
        "server.api_keys[0]",
        "server.management_token",
    ]
    assert all("shorter than 8 characters, so it is not scrubbed" in w for w in warnings)
    assert not any(secret in w for w in warnings for secret in ("Pw7x9Qz", "short12", 'tok"'))


@pytest.mark.parametrize("text", ["", "[providers]\n", "[server]\nport = 20129\n"])
def test_a_config_with_no_provider_warns_that_nothing_is_routable(tmp_path: Path, text: str) -> None:
    """It passed `config check` and `serve` started with nothing to route to, and not a word (found
    by a docs trial)."""
    path = write(tmp_path, text, mode=0o600)
    (warning,) = load_config(path, {}).warnings
    assert (
        warning
        == f"{path}: no providers are configured: every /v1 request is answered 404 model_not_found (add a [providers.NAME] table; docs/configuration.md)"
    )


def test_inline_key_in_a_private_file_does_not_warn(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_PROVIDER + 'api_key = "sk-inline-0123456789"\n', mode=0o600)
    assert load_config(path, {}).warnings == ()


def test_group_readable_token_warns_but_env_key_does_not(tmp_path: Path) -> None:
    if os.name == "nt":
        pytest.skip("no POSIX modes")
    path = write(tmp_path, MINIMAL_PROVIDER + 'api_key_env = "K"\n', mode=0o644)
    assert load_config(path, {"K": "sk-x-0123456789"}).warnings == ()
    path = write(tmp_path, '[server]\nmanagement_token = "t0ken-0123456789"\n' + MINIMAL_PROVIDER, mode=0o640)
    (warning,) = load_config(path, {}).warnings
    assert "server.management_token" in warning and "mode 0640" in warning


@pytest.mark.parametrize(
    ("key", "masked"),
    [
        ("sk-proj-abcdefghijklmnop", "sk-…mnop"),
        ("sk-abcdefghi", "sk-…fghi"),  # 12 chars: the long form
        ("abcdefghijk", "…jk"),  # 11 chars: too short to show 7 of them
        ("abcde", "…de"),
        ("abcd", "…"),
        (None, None),
    ],
)
def test_masked_key_forms(key: str | None, masked: str | None) -> None:
    conn = ConnectionConfig(id="c", provider="p", name="c", api_key=key, api_key_env=None)
    assert conn.masked_key() == masked


def test_fingerprint_follows_the_key_and_repr_hides_it() -> None:
    a = ConnectionConfig(id="c", provider="p", name="c", api_key="sk-secret-one", api_key_env=None)
    b = ConnectionConfig(id="c", provider="p", name="c", api_key="sk-secret-two", api_key_env=None)
    none = ConnectionConfig(id="c", provider="p", name="c", api_key=None, api_key_env=None)
    assert len(a.fingerprint()) == 16
    assert a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == ConnectionConfig("d", "q", "d", "sk-secret-one", None).fingerprint()
    assert none.fingerprint() == "e3b0c44298fc1c14"  # sha256 of ""
    assert "sk-secret-one" not in repr(a)
    assert "hunter2" not in repr(ServerConfig(management_token="hunter2", api_keys=("hunter2",)))


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '[server]\nport = 20128\nhost = "127.0.0.1\n',
            "line 3: Illegal character '\\n' (column 18; invalid TOML)",
            id="syntax",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace("base_url", "base_ur"),
            "providers.openai.base_ur: unknown key (did you mean 'base_url'?)",
            id="typo",
        ),
        pytest.param(
            "[providers]\nx = 3\n", "providers.x: must be a table (got an integer)", id="not-a-table"
        ),
        pytest.param("[sever]\n", "sever: unknown key (did you mean 'server'?)", id="unknown-section"),
        pytest.param(
            '[server]\nport = "20128"\n',
            "server.port: must be an integer between 1 and 65,535 (got a string)",
            id="wrong-type",
        ),
        pytest.param(
            "[server]\nport = true\n",
            "server.port: must be an integer between 1 and 65,535 (got a boolean)",
            id="bool-for-int",
        ),
        pytest.param(
            "[server]\nport = 70000\n",
            "server.port: must be an integer between 1 and 65,535 (got 70000)",
            id="port-range",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace('"apikey"', '"x"'),
            "providers.openai.class: must be one of local, apikey, oauth (got 'x')",
            id="class",
        ),
        pytest.param(
            '[providers.openai]\nbase_url = "https://a/v1"\n[[providers.openai.connections]]\nid = "o"\n',
            "providers.openai.class: missing (required): one of local, apikey, oauth",
            id="class-missing",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace("https://api.openai.com/v1", "ftp://api.openai.com"),
            "providers.openai.base_url: must be an http:// or https:// URL with a host",
            id="url-scheme",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace("https://api.openai.com/v1", "http://:8080/v1"),
            "providers.openai.base_url: must be an http:// or https:// URL with a host",
            id="url-no-host",
        ),
        pytest.param(
            MINIMAL_PROVIDER + '[[providers.ollama.connections]]\nid = "openai-main"\n',
            "providers.ollama.connections[0].id: duplicate connection id 'openai-main' "
            "(already used at providers.openai.connections[0].id)",
            id="duplicate-connection",
        ),
        pytest.param(
            '[providers.openai]\nclass = "apikey"\nbase_url = "https://api.openai.com/v1"\n',
            "providers.openai.connections: a provider needs at least one connection",
            id="no-connections",
        ),
        pytest.param(
            MINIMAL_PROVIDER + '[combos.c]\ntargets = ["nope/model-a"]\n',
            "combos.c.targets[0]: names unknown provider 'nope' (providers: openai)",
            id="combo-unknown-provider",
        ),
        pytest.param(
            MINIMAL_PROVIDER + '[combos.c]\ntargets = ["gpt-4o"]\n',
            "combos.c.targets[0]: must be provider/model (got 'gpt-4o')",
            id="combo-no-slash",
        ),
        pytest.param(
            MINIMAL_PROVIDER + '[combos.c]\nstrategy = "random"\ntargets = ["openai/gpt-4o"]\n',
            "combos.c.strategy: must be one of priority, round-robin (got 'random')",
            id="combo-strategy",
        ),
        pytest.param(
            '[server]\ndefault_combo = "coding"\n',
            "server.default_combo: names unknown combo 'coding' (combos: none defined)",
            id="default-combo",
        ),
        pytest.param(
            MINIMAL_PROVIDER + 'api_key = "sk-a"\napi_key_env = "OPENAI_API_KEY"\n',
            "providers.openai.connections[0]: set api_key or api_key_env, not both",
            id="both-keys",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace('id = "openai-main"', 'id = "a/b"'),
            "providers.openai.connections[0].id: connection id 'a/b' must start with",
            id="bad-connection-id",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace('id = "openai-main"', 'id = "a\\u001b]0;x\\u0007"'),
            "providers.openai.connections[0].id: connection id 'a\\x1b]0;x\\x07' must start with",
            id="id-with-escape-shown-escaped",
        ),
        pytest.param(
            MINIMAL_PROVIDER + 'name = "main\\tkey\\u001b[2J"\n',
            "providers.openai.connections[0].name: must not contain control characters (got 'main\\tkey\\x1b[2J')",
            id="name-with-control-characters",
        ),
        pytest.param(
            MINIMAL_PROVIDER + 'name = "rtl\\u202egnp"\n',
            "providers.openai.connections[0].name: must not contain control characters (got 'rtl\\u202egnp')",
            id="name-with-bidi-override",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace("[[", 'apis = ["chat", "mesages"]\n[[', 1),
            "providers.openai.apis[1]: must be one of chat, completions, embeddings, responses, messages"
            " (got 'mesages'; did you mean 'messages'?)",
            id="apis-typo",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace("[[", "apis = []\n[[", 1),
            "providers.openai.apis: must list at least one of chat, completions, embeddings, responses, messages",
            id="apis-empty",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace("[[", 'apis = "messages"\n[[', 1),
            "providers.openai.apis: must be an array of strings (got a string)",
            id="apis-not-a-list",
        ),
        pytest.param(
            MINIMAL_PROVIDER.replace("[[", 'auth = "x_api_key"\n[[', 1),
            "providers.openai.auth: must be one of bearer, x-api-key (got 'x_api_key')",
            id="auth",
        ),
        pytest.param(
            MINIMAL_PROVIDER + "max_concurrent = 0\n",
            "providers.openai.connections[0].max_concurrent: must be an integer between 1 and 10,000 (got 0)",
            id="max-concurrent",
        ),
        pytest.param(
            MINIMAL_PROVIDER + '[providers.openai.headers]\nX-Bad = "a\\nb"\n',
            "providers.openai.headers.X-Bad: must not contain line breaks or NUL",
            id="header-value",
        ),
        pytest.param(
            MINIMAL_PROVIDER
            + '[[providers.openai.restate]]\nid = "r"\nfrom = [403]\nto = 429\nmarker = ["q"]\n',
            "providers.openai.restate[0].marker: unknown key (did you mean 'markers'?)",
            id="restate-typo",
        ),
        pytest.param(
            MINIMAL_PROVIDER
            + '[[providers.openai.restate]]\nid = "r"\nfrom = "403"\nto = 429\nmarkers = ["q"]\n',
            "providers.openai.restate[0]: ",
            id="restate-bad-rule",
        ),
        pytest.param(
            MINIMAL_PROVIDER
            + '[[providers.openai.restate]]\nid = "r"\nfrom = [403]\nto = 429\nmarkers = ["q"]\n'
            + '[[providers.openai.restate]]\nid = "r"\nfrom = [400]\nto = 429\nmarkers = ["z"]\n',
            # (events and logs name a restatement by its rule's id: two rules with one id are one name
            # for two behaviours, and only the first could ever override a built-in rule)
            "providers.openai.restate[1].id: 'r' is already the id of restate[0]",
            id="restate-duplicate-id",
        ),
    ],
)
def test_each_error_kind_names_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    message = error_for(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'config.toml'}: ")
    assert expected in message


def test_all_problems_are_reported_together(tmp_path: Path) -> None:
    text = MINIMAL_PROVIDER.replace('"apikey"', '"cloud"') + (
        'priorty = 1\n[server]\nport = 0\n[combos.c]\ntargets = ["ghost/m"]\n'
    )
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert str(info.value).splitlines() == [
        f"{path}: server.port: must be an integer between 1 and 65,535 (got 0)",
        f"{path}: providers.openai.class: must be one of local, apikey, oauth (got 'cloud')",
        f"{path}: providers.openai.connections[0].priorty: unknown key (did you mean 'priority'?)",
        f"{path}: combos.c.targets[0]: names unknown provider 'ghost' (providers: openai)",
    ]
    assert info.value.path == path
    assert len(info.value.problems) == 4


def test_unreadable_inputs_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path, {}, explicit=True)
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[server]\nhost = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin1\.toml: line 2: not UTF-8 text \(byte 20\)"):
        load_config(path, {})


def test_syntax_error_at_end_of_document(tmp_path: Path) -> None:
    assert (
        error_for(tmp_path, "[server]\nport =")
        == f"{tmp_path / 'config.toml'}: Invalid value (at end of document) (invalid TOML)"
    )


# --- server exposure -----------------------------------------------------------------------------


def test_bind_refusal_for_non_loopback_without_token_and_keys() -> None:
    assert ServerConfig().bind_refusal() is None
    assert ServerConfig(host="localhost").bind_refusal() is None
    assert ServerConfig().bind_refusal("::1") is None
    refusal = ServerConfig().bind_refusal("0.0.0.0")
    assert refusal is not None and "0.0.0.0" in refusal and "management_token" in refusal
    assert ServerConfig(host="0.0.0.0", management_token="t").bind_refusal() is not None
    assert ServerConfig(host="0.0.0.0", management_token="t", api_keys=("k",)).bind_refusal() is None


def test_an_exposed_host_in_the_file_is_a_problem_for_check_config(tmp_path: Path) -> None:
    """`serve` refuses it, so `config check` (check_config) must too; it is no mere warning of
    load_config (which `serve --host 127.0.0.1` would then print about a host it does not use)."""
    path = write(tmp_path, '[server]\nport = 20200\nhost = "0.0.0.0"\n')
    assert [w for w in load_config(path, {}).warnings if NO_PROVIDERS not in w] == []
    with pytest.raises(ConfigError) as caught:
        check_config(path, {})
    (problem,) = caught.value.problems
    assert (problem.key, problem.line) == ("server.host", 3)
    assert problem.message.startswith("refusing to listen on 0.0.0.0")
    assert str(caught.value).startswith(f"{path}: server.host: refusing to listen on 0.0.0.0")
    safe = write(tmp_path, '[server]\nhost = "0.0.0.0"\nmanagement_token = "t"\napi_keys = ["k"]\n')
    assert check_config(safe, {}).server.host == "0.0.0.0"


def test_an_exposed_host_is_named_with_the_files_other_problems_at_once(tmp_path: Path) -> None:
    """ "Every problem at once": the refusal of a non-loopback host without tokens came only after
    the file's other problems were fixed (found by a lifecycle trial), from `config check` and
    `serve` alike; and not when `serve --host` moves the proxy back to loopback."""
    path = write(
        tmp_path, '[server]\nhost = "0.0.0.0"\nport = 99999\n\n[providers.x]\nclass = "local"\nprioriti = 1\n'
    )
    with pytest.raises(ConfigError) as caught:
        check_config(path, {})
    keys = [p.key for p in caught.value.problems]
    assert "server.port" in keys and "server.host" not in keys, keys  # [server] has its own: no guess
    other = write(tmp_path, '[server]\nhost = "0.0.0.0"\n\n[providers.x]\nclass = "local"\nprioriti = 1\n')
    with pytest.raises(ConfigError) as caught:
        check_config(other, {})
    said = [(p.key, p.line) for p in caught.value.problems]
    assert ("providers.x.prioriti", 6) in said and said[-1] == ("server.host", 2), said
    assert caught.value.problems[-1].message.startswith("refusing to listen on 0.0.0.0")
    with pytest.raises(serve.StartupError) as started:
        serve.load(serve.Options(config=str(other)), {})
    assert "refusing to listen on 0.0.0.0" in str(started.value)
    with pytest.raises(serve.StartupError) as started:
        serve.load(serve.Options(config=str(other), host="127.0.0.1"), {})
    assert "refusing to listen" not in str(started.value) and "prioriti" in str(started.value)


def test_problems_name_their_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[server]\nport = "high"\n\n[providers.x]\nclass = "cloud"\n\n[[providers.x.connections]]\nid = "a"\n'
        '\n[[providers.x.connections]]\nid = "b"\npriority = -1\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert [(p.key, p.line) for p in caught.value.problems] == [
        ("server.port", 2),
        ("providers.x.class", 5),
        ("providers.x.base_url", 4),  # missing: the line of its table
        ("providers.x.connections[1].priority", 12),
    ]
    assert caught.value.problems[0].to_dict(path) == {
        "file": str(path),
        "key": "server.port",
        "line": 2,
        "message": "must be an integer between 1 and 65,535 (got a string)",
    }


def test_a_deeply_nested_value_is_a_problem_not_a_recursion_error(tmp_path: Path) -> None:
    path = write(tmp_path, "x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert str(caught.value) == f"{path}: values nested too deeply to read (invalid TOML for omniroute)"


# --- starter file --------------------------------------------------------------------------------


def test_starter_config_for_detected_servers_loads_back(tmp_path: Path) -> None:
    text = render_starter_config(
        {"ollama": "http://localhost:11434/v1", "llamacpp": "http://127.0.0.1:8080/v1"}
    )
    assert '# [providers.openai]\n# class = "apikey"' in text
    assert "# [providers.lmstudio]" in text
    config = load_config(write(tmp_path, text, mode=0o644), {})
    assert config.warnings == ()
    assert list(config.providers) == ["ollama", "llamacpp"]
    assert config.providers["ollama"].connections[0].id == "ollama-1"
    assert config.providers["llamacpp"].base_url == "http://127.0.0.1:8080/v1"
    assert (config.server.host, config.server.port) == ("127.0.0.1", 20128)
    assert config.combos == {}


def test_the_starter_configs_anthropic_example_loads_when_uncommented(tmp_path: Path) -> None:
    text = render_starter_config({})
    start = text.index("# [providers.anthropic]")
    block = text[start : text.index("\n\n", start)]
    live = "\n".join(line.removeprefix("# ") for line in block.splitlines())
    config = load_config(write(tmp_path, live), {"ANTHROPIC_API_KEY": "sk-ant"}, explicit=True)
    anthropic = config.providers["anthropic"]
    assert (anthropic.apis, anthropic.auth) == ({"messages"}, "x-api-key")
    assert anthropic.connections[0].api_key == "sk-ant"


def test_starter_config_with_nothing_detected_matches_the_embedded_default(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, render_starter_config({})), {})
    default = embedded_default()
    assert dict(config.providers) == dict(default.providers)
    assert config.server == default.server


def test_starter_config_quotes_odd_urls(tmp_path: Path) -> None:
    odd = 'http://gpu-box:8000/v1"\\x\t'
    text = render_starter_config({"vllm": odd})
    assert load_config(write(tmp_path, text), {}).providers["vllm"].base_url == 'http://gpu-box:8000/v1"\\x'
    with pytest.raises(ValueError, match="not a valid provider id"):
        render_starter_config({"a/b": "http://x"})


# --- paths ---------------------------------------------------------------------------------------


def test_config_path_precedence_cli_then_env_then_default() -> None:
    env = {"OMNIROUTE_CONFIG": "/env/config.toml"}
    assert resolve_config_path("/cli/config.toml", env) == Path("/cli/config.toml")
    assert resolve_config_path(None, env) == Path("/env/config.toml")
    assert resolve_config_path(None, {}) == default_config_path()
    assert resolve_config_path(None, {"OMNIROUTE_CONFIG": ""}) == default_config_path()


def test_state_path_precedence_cli_then_env_then_default() -> None:
    env = {"OMNIROUTE_STATE": "/env/state.db"}
    assert resolve_state_path("/cli/state.db", env) == Path("/cli/state.db")
    assert resolve_state_path(None, env) == Path("/env/state.db")
    assert resolve_state_path(None, {}) == default_state_path()


def test_default_paths_follow_platformdirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.name == "nt" or os.uname().sysname == "Darwin":
        pytest.skip("XDG variables only steer platformdirs on Linux")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_config_path() == tmp_path / "cfg" / "omniroute" / "config.toml"
    assert default_state_path() == tmp_path / "data" / "omniroute" / "state.db"


# --- who may call the proxy ----------------------------------------------------------------------


def test_allowed_hosts_and_origins_are_normalised(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[server]\nallowed_hosts = ["Proxy.LAN.", "[fd00::5]:20128", "192.168.1.20"]\n'
        'allowed_origins = ["HTTP://LocalHost:3000/", "https://app.example:443"]\n',
    )
    server = load_config(path, {}).server
    assert server.allowed_hosts == ("proxy.lan", "fd00::5", "192.168.1.20")
    assert server.allowed_origins == ("http://localhost:3000", "https://app.example")
    assert ServerConfig().allowed_hosts == () and ServerConfig().allowed_origins == ()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('allowed_hosts = ["http://proxy.lan"]', "server.allowed_hosts[0]"),
        ('allowed_hosts = ["a b"]', "server.allowed_hosts[0]"),
        ('allowed_hosts = "proxy.lan"', "server.allowed_hosts"),
        ('allowed_origins = ["proxy.lan"]', "server.allowed_origins[0]"),
        ('allowed_origins = ["http://x.lan/app"]', "server.allowed_origins[0]"),
        ('allowed_origins = ["null"]', "server.allowed_origins[0]"),
        ('allowed_origins = ["*"]', "server.allowed_origins[0]"),
    ],
)
def test_a_bad_allowed_host_or_origin_is_named(tmp_path: Path, text: str, key: str) -> None:
    assert f"{key}: must" in error_for(tmp_path, f"[server]\n{text}\n")


@pytest.mark.parametrize("host", ["*", "*.lan"])
def test_a_wildcard_allowed_host_is_refused_not_matched_against_nothing(tmp_path: Path, host: str) -> None:
    """A Host is compared whole: `["*"]` was accepted and let no host in, silently (found by a trial)."""
    message = error_for(tmp_path, f'[server]\nallowed_hosts = ["{host}"]\n')
    assert "server.allowed_hosts[0]: wildcards are not supported" in message


def test_a_base_url_holding_a_control_character_is_refused(tmp_path: Path) -> None:
    message = error_for(
        tmp_path,
        '[providers.p]\nclass = "local"\nbase_url = "http://127.0.0.1:9/v1\\u0000"\n'
        '[[providers.p.connections]]\nid = "p-1"\n',
    )
    assert "providers.p.base_url: must be an http:// or https:// URL" in message


def test_loopback_names_and_addresses() -> None:
    from proxy.config import host_name, is_loopback_host

    for host in (
        "localhost",
        "LOCALHOST.",
        "app.localhost",
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "[::1]",
        "::ffff:127.0.0.1",
    ):
        assert is_loopback_host(host), host
    for host in ("0.0.0.0", "::", "localhost.evil.example", "127.0.0.1.evil.example", "[::1", "", "10.0.0.1"):
        assert not is_loopback_host(host), host
    assert [host_name(h) for h in ("[::1]:80", "Localhost:20128", "x.lan.", "[::1]x", "::1")] == [
        "::1",
        "localhost",
        "x.lan",
        "[::1]x",
        "::1",
    ]


def test_a_key_in_a_providers_headers_is_a_secret_like_the_others(tmp_path: Path) -> None:
    """Some services take their key in a header of their own (Azure OpenAI's `api-key`), which only
    `[providers.<id>.headers]` can send: a header named like a credential holds a secret, which the
    scrubber must know, while an organisation id or an API version stays plain text."""
    path = write(
        tmp_path,
        '[providers.az]\nclass = "apikey"\nbase_url = "https://az.example.com/openai"\n\n'
        '[providers.az.headers]\napi-key = "AzureSecretKey123456"\nX-Auth-Token = "tok-0123456789"\n'
        'OpenAI-Organization = "org-abc12345"\napi-version = "2024-02-01"\n\n'
        '[[providers.az.connections]]\nid = "az-1"\n',
    )
    secrets = load_config(path, {}).secrets()
    assert "AzureSecretKey123456" in secrets and "tok-0123456789" in secrets
    assert "org-abc12345" not in secrets and "2024-02-01" not in secrets


_BASIC_URL = "http://svc:pass%40word-1234@127.0.0.1:9/v1"
"""A base_url with a user name and a password (`pass@word-1234`, written percent-encoded)."""


def test_a_base_url_password_is_a_secret_as_written_as_read_and_as_sent(tmp_path: Path) -> None:
    """A base_url's user name and password go upstream as `Authorization: Basic`: an upstream that
    quoted them, either way, showed them to the client, the events and the trail (found by a trial)."""
    path = write(
        tmp_path,
        f'[providers.priv]\nclass = "local"\nbase_url = "{_BASIC_URL}"\n[[providers.priv.connections]]\nid = "p-1"\n',
    )
    secrets = load_config(path, {}).secrets()
    assert "pass%40word-1234" in secrets and "pass@word-1234" in secrets
    assert base64.b64encode(b"svc:pass@word-1234").decode() in secrets


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        pytest.param('api_key = "sk-a-key-0123456789"\n', True, id="a-bearer-key"),
        pytest.param("", False, id="no-key"),
    ],
)
def test_a_base_url_password_and_a_key_in_the_same_header_are_refused(
    tmp_path: Path, extra: str, refused: bool
) -> None:
    """Both are sent as `Authorization`: every request failed inside the HTTP client, a 500
    internal_error, though `config check` called the file OK (found by a trial)."""
    text = (
        f'[providers.priv]\nclass = "apikey"\nbase_url = "{_BASIC_URL}"\n'
        f'[[providers.priv.connections]]\nid = "priv-1"\n{extra}'
    )
    if not refused:
        load_config(write(tmp_path, text), {}, explicit=True)
        return
    message = error_for(tmp_path, text)
    assert "providers.priv.base_url: holds a user name and password" in message
    assert "connection priv-1's api_key" in message and "word-1234" not in message
    header = error_for(
        tmp_path,
        f'[providers.priv]\nclass = "apikey"\nbase_url = "{_BASIC_URL}"\n'
        '[providers.priv.headers]\nAuthorization = "Bearer someone-elses-0123"\n'
        '[[providers.priv.connections]]\nid = "priv-1"\n',
    )
    assert "providers.priv.headers.Authorization" in header
    # The Anthropic style sends its key in x-api-key: the two go together.
    load_config(write(tmp_path, text.replace('class = "apikey"', 'class = "apikey"\nauth = "x-api-key"')), {})


def test_a_refused_base_url_is_quoted_without_its_password_or_query(tmp_path: Path) -> None:
    message = error_for(
        tmp_path,
        '[providers.priv]\nclass = "local"\nbase_url = "ftp://svc:pass-word-1234@h/v1?key=QuerySecret123"\n'
        '[[providers.priv.connections]]\nid = "p-1"\n',
    )
    assert "(got 'ftp://h/v1?…')" in message and "pass-word" not in message and "QuerySecret" not in message
