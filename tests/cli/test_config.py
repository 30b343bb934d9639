"""`omniroute config init|path|check`: no instance needed."""

from __future__ import annotations

import json
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy import config as proxy_config
from proxy.config import load_config
from tests.cli.conftest import run
from tests.fakes import FakeUpstream, serve


@pytest.fixture
def local_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """ollama answers /models; lmstudio and vllm refuse; llamacpp answers 404 (a web server, not an LLM)."""
    fake = FakeUpstream("ollama")
    with serve(fake.app) as live:
        monkeypatch.setitem(proxy_config.BUILTIN_LOCAL_PROVIDERS, "ollama", live.url + "/v1")
        monkeypatch.setitem(proxy_config.BUILTIN_LOCAL_PROVIDERS, "lmstudio", FakeUpstream.refused_url())
        monkeypatch.setitem(proxy_config.BUILTIN_LOCAL_PROVIDERS, "llamacpp", live.url + "/elsewhere")
        monkeypatch.setitem(proxy_config.BUILTIN_LOCAL_PROVIDERS, "vllm", FakeUpstream.refused_url())
        yield live.url + "/v1"


def test_init_writes_detected_servers_mode_0600(tmp_path: Path, local_servers: str) -> None:
    path = tmp_path / "new" / "config.toml"
    result = run("config", "init", "--config", str(path), "--json")
    assert result.json() == {"path": str(path), "detected": {"ollama": local_servers}}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = tomllib.loads(path.read_text())
    assert list(doc["providers"]) == ["ollama"]  # the others are commented examples
    assert doc["providers"]["ollama"]["base_url"] == local_servers
    config = load_config(path, {}, explicit=True)
    assert [c.id for p in config.providers.values() for c in p.connections] == ["ollama-1"]


def test_init_with_nothing_answering_writes_every_builtin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for pid in list(proxy_config.BUILTIN_LOCAL_PROVIDERS):
        monkeypatch.setitem(proxy_config.BUILTIN_LOCAL_PROVIDERS, pid, FakeUpstream.refused_url())
    path = tmp_path / "config.toml"
    result = run("config", "init", "--config", str(path))
    assert result.code == 0, result.stderr
    assert result.stdout.startswith(f"Wrote {path} (mode 0600). Local servers answering: none")
    assert set(tomllib.loads(path.read_text())["providers"]) == {"ollama", "lmstudio", "llamacpp", "vllm"}


def test_init_goes_to_the_default_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, local_servers: str
) -> None:
    assert run("config", "init").code == 0
    assert (tmp_path / "xdg-config" / "omniroute" / "config.toml").is_file()


def test_init_refuses_to_overwrite_without_force(tmp_path: Path, local_servers: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text("# mine\n")
    path.chmod(0o644)
    result = run("config", "init", "--config", str(path))
    assert result.code == 2
    assert result.stderr == (
        f"omniroute: {path} already exists; pass --force to overwrite it (`omniroute config check` validates it)\n"
    )
    assert path.read_text() == "# mine\n"
    assert run("config", "init", "--config", str(path), "--force").code == 0
    assert path.read_text().startswith("# omniroute config")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_path_shows_config_and_state(tmp_path: Path) -> None:
    data = run("config", "path", "--json").json()
    assert data == {
        "config": str(tmp_path / "xdg-config" / "omniroute" / "config.toml"),
        "configExists": False,
        "state": str(tmp_path / "xdg-data" / "omniroute" / "state.db"),
        "stateExists": False,
    }
    mine = tmp_path / "c.toml"
    mine.write_text("")
    data = run("config", "path", "--json", "--config", str(mine), "--state", str(tmp_path / "s.db")).json()
    assert (data["config"], data["configExists"], data["state"]) == (str(mine), True, str(tmp_path / "s.db"))
    human = run("config", "path")
    assert "not found: the embedded default is used" in human.stdout


def test_check_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[server]\nport = 20200\n\n[providers.ollama]\n\n[[providers.ollama.connections]]\nid = "o-1"\n'
        '\n[combos.coding]\ntargets = ["ollama/qwen"]\n'
    )
    result = run("config", "check", "--config", str(path))
    assert (result.code, result.stdout) == (
        0,
        f"{path}: OK. 1 provider, 1 connection, 1 combo; listens on 127.0.0.1:20200; management token not set;"
        " state in the state file.\n",
    )
    data = run("config", "check", "--config", str(path), "--json").json()
    assert data["providers"] == {
        "ollama": {"class": "local", "baseUrl": "http://localhost:11434/v1", "connections": ["o-1"]}
    }
    assert data["combos"] == {"coding": ["ollama/qwen"]}
    assert data["server"] == {"host": "127.0.0.1", "port": 20200, "managementToken": False, "apiKeys": 0}
    assert data["state"] == {"backend": "sqlite", "keyPrefix": "omniroute:"}


def test_check_names_a_fleets_redis_without_its_password(tmp_path: Path) -> None:
    """A fleet's pre-flight said nothing of the fleet (found by a trial): it now names the Redis and
    the prefix the replicas will share, never the URL's password."""
    path = tmp_path / "config.toml"
    path.write_text(
        '[state]\nbackend = "redis://:s3cret-pass@10.0.0.5:6380/2"\nkey_prefix = "team-eu:"\n\n'
        '[providers.ollama]\n\n[[providers.ollama.connections]]\nid = "o-1"\n'
    )
    result = run("config", "check", "--config", str(path), env={"COLUMNS": "300"})
    assert result.code == 0, result.stderr
    assert "state in redis://10.0.0.5:6380/2 under 'team-eu:', shared by a fleet." in result.stdout
    data = run("config", "check", "--config", str(path), "--json").json()
    assert data["state"] == {"backend": "redis://10.0.0.5:6380/2", "keyPrefix": "team-eu:"}
    assert "s3cret" not in result.stdout + json.dumps(data)


def test_check_embedded_default_when_no_file() -> None:
    result = run("config", "check")
    assert result.code == 0, result.stderr
    assert "the embedded default: OK. 4 providers, 4 connections" in result.stdout


def test_check_invalid_file_exits_2_naming_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[server]\nport = "high"\n\n[providers.x]\nclass = "cloud"\n')
    result = run("config", "check", "--config", str(path))
    assert result.code == 2
    assert result.stdout == ""
    # One problem per line, exactly as `serve` prints them.
    assert result.stderr.splitlines() == [
        f"omniroute: {path}: server.port: must be an integer between 1 and 65,535 (got a string)",
        f"{path}: providers.x.class: must be one of local, apikey, oauth (got 'cloud')",
        f"{path}: providers.x.base_url: missing (required)",
        f"{path}: providers.x.connections: a provider needs at least one connection:"
        " add a [[providers.x.connections]] table with an id",
    ]
    data = json.loads(run("config", "check", "--config", str(path), "--json").stdout)
    assert data["valid"] is False
    assert data["problems"][:2] == [
        {
            "file": str(path),
            "key": "server.port",
            "line": 2,
            "message": "must be an integer between 1 and 65,535 (got a string)",
        },
        {
            "file": str(path),
            "key": "providers.x.class",
            "line": 5,
            "message": "must be one of local, apikey, oauth (got 'cloud')",
        },
    ]
    missing = run("config", "check", "--config", str(tmp_path / "absent.toml"))
    assert (missing.code, missing.stderr) == (2, f"omniroute: {tmp_path / 'absent.toml'}: no such file\n")


def test_a_refused_start_shows_a_hostile_host_as_visible_text(tmp_path: Path) -> None:
    """The refusal quotes the `--host` it was given: an escape sequence in it reached the terminal.
    (`tui` prints its refusal through the same `visible_lines`; it needs a terminal to get there.)"""
    config = tmp_path / "config.toml"
    config.write_text("")
    result = run("serve", "--config", str(config), "--host", "h\x1b]0;PWNED\x07", "--port", "1")
    assert result.code == 2, result.stderr
    assert "refusing to listen on h\\x1b]0;PWNED\\x07:" in result.stderr, result.stderr
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr


def test_check_refuses_what_serve_refuses(tmp_path: Path) -> None:
    """`config check` said OK to a file `serve` refuses: a non-loopback host without token and keys."""
    path = tmp_path / "config.toml"
    path.write_text('[server]\nhost = "0.0.0.0"\n')
    result = run("config", "check", "--config", str(path))
    assert result.code == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"omniroute: {path}: server.host: refusing to listen on 0.0.0.0")
    served = run("serve", "--config", str(path), "--state", str(tmp_path / "state.db"))
    assert served.code == 2
    assert "refusing to listen on 0.0.0.0" in served.stderr
    data = json.loads(run("config", "check", "--config", str(path), "--json").stdout)
    assert data == {
        "path": str(path),
        "valid": False,
        "problems": [
            {"file": str(path), "key": "server.host", "line": 2, "message": line.split("server.host: ")[1]}
        ],
    }


def test_check_of_a_deeply_nested_file_is_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    result = run("config", "check", "--config", str(path))
    assert (result.code, result.stderr) == (
        2,
        f"omniroute: {path}: values nested too deeply to read (invalid TOML for omniroute)\n",
    )


def test_a_broken_config_stops_remote_commands_with_2(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[server\n")
    result = run("status", "--config", str(path))
    assert result.code == 2
    assert result.stderr.startswith(f"omniroute: {path}: line 1:")
    assert result.stderr.endswith("fix it (`omniroute config check`) or pass --url\n")


_HUGE = "0x" + "f" * 5000


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param(f"[server]\nport = {'9' * 5000}\n", None, id="decimal"),
        pytest.param(f"[server]\nport = {_HUGE}\n", "server.port", id="hexadecimal"),
        pytest.param(
            '[providers.p]\nclass = "local"\nbase_url = "http://127.0.0.1:9/v1"\n'
            f'[[providers.p.restate]]\nid = "r"\nfrom = [{_HUGE}]\nto = 429\nmarkers = ["x"]\n'
            '[[providers.p.connections]]\nid = "p-1"\n',
            "providers.p.restate[0]",
            id="a-status",
        ),
    ],
)
def test_an_integer_of_thousands_of_digits_is_a_config_problem_not_an_unexpected_error(
    tmp_path: Path, text: str, key: str | None
) -> None:
    """CPython converts at most 4,300 digits between an integer and its text: tomllib's reading of
    a longer one, or a message quoting a long hexadecimal one, raised a bare ValueError, exit 1,
    `unexpected error`, with no file or key named (found by a trial)."""
    path = tmp_path / "config.toml"
    path.write_text(text)
    result = run("config", "check", "--config", str(path))
    assert result.code == 2, result.stderr
    assert result.stderr.startswith(f"omniroute: {path}") and "unexpected error" not in result.stderr
    if key is not None:
        assert key in result.stderr and "an integer far out of range" in result.stderr


def test_check_shows_a_base_url_without_its_password(tmp_path: Path) -> None:
    """The summary said whether a token is set, never the token, but printed each base_url as
    written, password and all (found by a trial)."""
    path = tmp_path / "config.toml"
    path.write_text(
        '[providers.priv]\nclass = "local"\nbase_url = "http://svc:pass-word-secret-1234@127.0.0.1:9/v1"\n'
        '[[providers.priv.connections]]\nid = "priv-1"\n'
    )
    path.chmod(0o600)
    result = run("config", "check", "--config", str(path), "--json")
    assert result.json()["providers"]["priv"]["baseUrl"] == "http://127.0.0.1:9/v1"
    assert "pass-word-secret-1234" not in result.stdout + result.stderr
