"""Exit codes and messages at the edge: one line on stderr that says what to do, never a traceback."""

from __future__ import annotations

import contextlib
import inspect
import json
import re
from collections.abc import Callable, Iterator

import pytest
import typer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from omniroute_tui.cli.exit_codes import ExitCode
from tests.cli.conftest import TOKEN, Instance, Result, run
from tests.fakes import FakeUpstream, serve

START = "start one with `omniroute serve` or `omniroute tui`, or point --url / OMNIROUTE_URL at it"

COMMANDS = [
    ["serve"], ["tui"], ["status"], ["breakers"], ["cooldowns"], ["lockouts"], ["connections"],
    ["reset", "breaker"], ["reset", "connection"], ["reenable"], ["enable"], ["disable"],
    ["settings", "show"], ["settings", "set"], ["settings", "reset"],
    ["config", "init"], ["config", "path"], ["config", "check"],
]  # fmt: skip


def one_line(result: Result) -> str:
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("omniroute: ")
    return result.stderr[len("omniroute: ") : -1]


def fake_app(status: int, body: object) -> Starlette:
    async def answer(request: Request) -> Response:
        if isinstance(body, str):
            return PlainTextResponse(body, status_code=status)
        return JSONResponse(body, status_code=status)

    return Starlette(
        routes=[Route("/{path:path}", answer, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])]
    )


Answering = Callable[[int, object], str]


@pytest.fixture
def answering() -> Iterator[Answering]:
    """`answering(status, body)` → URL of a server that answers every request that way."""
    with contextlib.ExitStack() as stack:
        yield lambda status, body: stack.enter_context(serve(fake_app(status, body))).url


def test_exit_codes_are_the_documented_ones() -> None:
    assert [(c.name, int(c)) for c in ExitCode] == [
        ("OK", 0), ("UNEXPECTED", 1), ("USAGE", 2), ("NO_INSTANCE", 3), ("AUTH", 4), ("NOT_FOUND", 5),
        ("DEGRADED", 6),
    ]  # fmt: skip


def test_every_exit_code_is_in_the_help_epilog_and_the_readme() -> None:
    from pathlib import Path

    epilog = " ".join(run("--help").stdout.split())
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    for code in ExitCode:
        assert f"{int(code)} " in epilog, code
        assert f"`{int(code)}` " in readme, code
    assert "6 status: the instance is degraded" in epilog


def test_0_ok(proxy: Instance) -> None:
    assert proxy.cli("status").code == 0


def test_1_server_error(answering: Answering) -> None:
    url = answering(500, {"error": {"message": "internal error; see the server log", "type": "server_error"}})
    result = run("breakers", "--url", url)
    assert result.code == 1
    assert one_line(result) == (
        f"{url} answered 500 to GET /api/monitoring/health: internal error; see the server log"
    )


def test_1_not_json(answering: Answering) -> None:
    url = answering(200, "<html>hello</html>")
    result = run("lockouts", "--url", url)
    assert result.code == 1
    assert one_line(result) == (
        f"{url} answered GET /api/resilience/model-cooldowns with something that is not JSON;"
        " is it an omniroute instance?"
    )


@pytest.mark.parametrize("command", [["events", "--follow"], ["requests", "--follow", "--json"]])
def test_1_following_what_is_not_an_event_stream(answering: Answering, command: list[str]) -> None:
    """A web page where the stream should be is an answer that is not the API's (exit 1), as the
    same command without `--follow` says: it read as the instance having stopped (exit 3: "start
    one"), found by a scripting trial."""
    url = answering(200, "<html>hello</html>")
    result = run(*command, "--url", url)
    assert result.code == 1 and result.stdout == ""
    assert one_line(result) == (
        f"{url} answered GET /api/stream with something that is not an event stream;"
        " is it an omniroute instance?"
    )


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_1_an_answer_with_numbers_json_has_not_is_not_json(answering: Answering, constant: str) -> None:
    """Python's parser reads NaN and Infinity, and `--json` passed them on: what it printed was no
    JSON for `jq` (found by a trial against a hostile server)."""
    url = answering(200, f'{{"connections": [{{"id": "x", "inFlight": {constant}}}]}}')
    result = run("connections", "--json", "--url", url)
    assert result.code == 1 and result.stdout == ""
    assert one_line(result).endswith("with something that is not JSON; is it an omniroute instance?")


def test_1_unexpected_shape_is_one_line_without_traceback(answering: Answering) -> None:
    url = answering(200, {"surprise": True})
    result = run("breakers", "--url", url)
    assert result.code == 1
    assert one_line(result) == (
        "unexpected error: KeyError: 'providerBreakers' (set OMNIROUTE_DEBUG=1 for a traceback)"
    )


def test_2_bad_usage() -> None:
    result = run("breakers", "--bogus")
    assert result.code == 2
    assert one_line(result) == "No such option: --bogus (see `omniroute breakers --help`)"
    missing = run("enable")
    assert missing.code == 2
    assert one_line(missing) == "Missing argument 'ID'. (see `omniroute enable --help`)"
    unknown = run("frobnicate")
    assert unknown.code == 2
    assert one_line(unknown).startswith("No such command 'frobnicate'.")


def test_2_no_arguments_prints_help() -> None:
    result = run()
    assert result.code == 2
    assert "Usage: omniroute" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "command", [["status"], ["events", "--follow"], ["requests", "--follow"]], ids=lambda c: " ".join(c)
)
def test_3_nothing_listening(command: list[str]) -> None:
    """The same words whether the command asks once or follows the stream: a stream that never
    opened did not break, there was nothing to follow."""
    url = FakeUpstream.refused_url().removesuffix("/v1")
    result = run(*command, "--url", url)
    assert result.code == 3
    message = one_line(result)
    assert message.startswith(f"no omniroute instance at {url} (")
    assert message.endswith(f"); {START}")


def test_3_default_url_from_the_embedded_config() -> None:
    """No config file, no --url: the embedded default's 127.0.0.1:20128 (nothing listens there in tests)."""
    result = run("breakers", env={"OMNIROUTE_URL": FakeUpstream.refused_url().removesuffix("/v1")})
    assert result.code == 3


def test_3_not_an_omniroute_instance(answering: Answering) -> None:
    url = answering(404, "Not Found")
    result = run("connections", "--url", url)
    assert result.code == 3
    assert one_line(result) == (
        f"{url} does not serve the omniroute management API (GET /api/resilience/connections answered 404); {START}"
    )


def test_4_missing_token(secured: Instance) -> None:
    result = run("breakers", "--url", secured.url)
    assert result.code == 4
    assert (
        one_line(result)
        == f"{secured.url} needs a management token: set --token or OMNIROUTE_MANAGEMENT_TOKEN"
    )


def test_4_wrong_token(secured: Instance) -> None:
    result = run("reset", "breaker", "--all", "--url", secured.url, "--token", "wrong")
    assert result.code == 4
    assert one_line(result) == (
        f"{secured.url} refused the management token: set --token or OMNIROUTE_MANAGEMENT_TOKEN to the right one"
    )
    assert run("breakers", "--url", secured.url, "--token", TOKEN).code == 0


def test_4_forbidden(answering: Answering) -> None:
    message = "the management API answers loopback clients only unless server.management_token is set"
    url = answering(403, {"error": {"message": message, "type": "permission_error"}})
    result = run("status", "--url", url)
    assert result.code == 4
    assert one_line(result) == (
        f"{url} refused this client ({message}); set server.management_token and set --token or"
        " OMNIROUTE_MANAGEMENT_TOKEN"
    )


def test_5_no_such_connection(proxy: Instance) -> None:
    result = proxy.cli("disable", "ghost")
    assert result.code == 5
    assert one_line(result) == f"no connection 'ghost' at {proxy.url}"


def test_bad_url_is_usage() -> None:
    result = run("status", "--url", "ftp://example")
    assert result.code == 2
    assert one_line(result).startswith("--url 'ftp://example' is not a usable URL")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:99999", "the port must be between 1 and 65535 (got 99999)"),
        ("http://127.0.0.1:0", "the port must be between 1 and 65535 (got 0)"),
        ("http://127.0.0.1:port", "the port must be a number between 1 and 65535 (got 'port')"),
        ("http://:20128", "it names no host"),
        ("localhost:20128", "the scheme must be http or https (got 'localhost')"),
        ("127.0.0.1:20128", "the scheme must be http or https (got none)"),
        ("http://[::1", "Invalid IPv6 URL"),
        (
            "http://" + "a" * 64 + ".example",  # a DNS label is at most 63 characters: exit 1 before
            "the host name is not one DNS can hold (a label empty or over 63 characters)",
        ),
    ],
)
def test_2_an_unusable_url_names_url_before_anything_is_sent(url: str, why: str) -> None:
    """Not 3 ("no instance"): no instance can ever answer at such a URL, so it is bad usage."""
    result = run("breakers", "--url", url)
    assert result.code == 2
    assert one_line(result) == f"--url {url!r} is not a usable URL: {why}"


def test_2_an_unusable_url_from_the_environment_says_where_it_came_from() -> None:
    result = run("status", env={"OMNIROUTE_URL": "http://127.0.0.1:99999"})
    assert result.code == 2
    assert one_line(result) == (
        "--url 'http://127.0.0.1:99999' (from OMNIROUTE_URL) is not a usable URL:"
        " the port must be between 1 and 65535 (got 99999)"
    )


@pytest.mark.parametrize("command", [["breakers"], ["tui"]])
@pytest.mark.parametrize("url", ["", "  "])
def test_2_an_empty_url_given_by_hand_is_refused_not_taken_for_none(command: list[str], url: str) -> None:
    """A script's `--url "$PROD"` with PROD unset must not talk to this machine's instance instead,
    nor `tui` host one when it was asked to attach."""
    result = run(*command, "--url", url)
    assert result.code == 2
    assert one_line(result) == "--url '' is not a usable URL: the scheme must be http or https (got none)"


def test_an_empty_omniroute_url_is_unset() -> None:
    """As click reads any empty variable (and shells leave them behind): the usual defaults apply."""
    result = run("breakers", env={"OMNIROUTE_URL": ""})
    assert result.code == 3 and "not a usable URL" not in result.stderr


@pytest.mark.parametrize(
    ("args", "env", "source"),
    [
        (["status"], {"OMNIROUTE_MANAGEMENT_TOKEN": TOKEN + "\r"}, "OMNIROUTE_MANAGEMENT_TOKEN"),
        (["breakers", "--token", TOKEN + "\u00e9"], {}, "--token"),
        (["tui", "--token", TOKEN + " x"], {}, "--token"),
    ],
)
def test_2_a_token_no_header_can_carry_is_named_before_anything_is_sent_and_never_shown(
    secured: Instance, args: list[str], env: dict[str, str], source: str
) -> None:
    """A token file saved with CRLF: the instance is up, yet the answer was "no omniroute instance"
    (exit 3) with the token printed in httpx's words; a non-ASCII one was blamed on --url."""
    result = run(*args, "--url", secured.url, env=env)
    assert result.code == 2
    assert one_line(result) == (
        f"{source} holds a space, a control character (a trailing newline?) or a non-ASCII character;"
        " it is sent in a header and must be printable ASCII"
    )
    assert TOKEN not in result.stdout + result.stderr


@pytest.mark.parametrize("url", ["https://omniroute.example:443", "http://[::1]:20128", "http://localhost"])
def test_a_usable_url_passes_the_check(url: str) -> None:
    from omniroute_tui.cli.client import check_url

    assert check_url(url) is None


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(command: list[str]) -> None:
    result = run(*command, "--help")
    assert result.code == 0, result.stderr
    assert "Example" in result.stdout


def test_remote_commands_take_url_token_and_json() -> None:
    for command in COMMANDS[2:15]:
        text = run(*command, "--help").stdout
        for option in ("--url", "--token", "--json", "--config"):
            assert option in text, (command, option)


def test_every_command_with_json_takes_o_json_as_an_alias() -> None:
    with_json = [c for c in COMMANDS if "--json" in run(*c, "--help").stdout]
    assert len(with_json) == 16
    for command in with_json:
        text = run(*command, "--help").stdout
        assert "-o" in text and "--output" in text, command


def test_o_json_prints_what_json_prints(proxy: Instance) -> None:
    expected = proxy.cli("breakers", "--json")
    assert expected.code == 0
    for spelling in (["-o", "json"], ["-ojson"], ["--output", "json"], ["--output=json"]):
        assert proxy.cli("breakers", *spelling) == expected, spelling
    assert run("config", "path", "-o", "json").json() == run("config", "path", "--json").json()


def test_o_takes_only_json() -> None:
    result = run("breakers", "-o", "yaml")
    assert result.code == 2
    assert "'-o' / '--output'" in one_line(result) and "'yaml' is not one of 'json'" in one_line(result)


def test_shell_completion_is_offered() -> None:
    text = run("--help").stdout
    assert "--install-completion" in text and "--show-completion" in text
    completion = run("--show-completion", "bash")
    assert completion.code == 0
    assert "_OMNIROUTE_COMPLETE" in completion.stdout


def test_version() -> None:
    result = run("--version")
    assert (result.code, result.stdout) == (0, "omniroute 0.1.0\n")


@pytest.mark.parametrize("command", [*COMMANDS, []], ids=lambda c: " ".join(c) or "root")
def test_help_text_has_no_swallowed_markup_or_double_space(command: list[str]) -> None:
    """Rich reads `[server]` as a markup tag: unescaped, it vanished and left "the config's  host"."""
    text = run(*command, "--help", env={"COLUMNS": "300"}).stdout
    # Two spaces after a word and before a lowercase one: a gap inside a sentence, not column padding.
    assert [line for line in text.splitlines() if re.search(r"[a-z,.;:')]  +[a-z]", line)] == []
    if "Instance to talk to" in text:  # the --url option's help
        assert "the config's [server] host and port" in text


@pytest.mark.parametrize("command", [*COMMANDS, []], ids=lambda c: " ".join(c) or "root")
def test_help_paragraphs_flow_to_the_terminals_width(command: list[str]) -> None:
    """Typer keeps a help paragraph's line breaks in Rich markup mode: a docstring wrapped at 100
    columns printed ragged at 80 (a line of 80, a line of 20...). Each paragraph is one line when
    the terminal is wide enough to hold it."""
    from omniroute_tui.cli import app

    group = typer.main.get_command(app)
    for name in command:
        group = group.commands[name]  # type: ignore[attr-defined]  (a group's: Typer's own click)
    text = run(*command, "--help", env={"COLUMNS": "1000"}).stdout
    shown = [" ".join(line.split()) for line in text.splitlines()]
    for paragraph in inspect.cleandoc(group.help or "").split("\n\n"):
        said = " ".join(paragraph.split())
        if said and not said.startswith("\b"):
            plain = re.sub(r"\[/?[a-z ]+\]", "", said)  # (Rich markup tags print as nothing)
            assert plain in shown, paragraph


@pytest.mark.parametrize(
    "group", [[], ["reset"], ["settings"], ["config"]], ids=lambda g: " ".join(g) or "root"
)
def test_each_command_of_a_group_is_summed_up_on_one_line(group: list[str]) -> None:
    """Typer's Rich mode kept a docstring's line breaks in the list of commands: at any width,
    `tui`'s summary broke after "or with --url"."""
    text = run(*group, "--help", env={"COLUMNS": "300"}).stdout
    assert "│ " in text
    assert [line for line in text.splitlines() if re.match(r"│ {6,}\S", line)] == []


def test_a_url_with_a_user_name_and_password_is_refused_without_printing_them() -> None:
    """Its password was printed in every message ("no instance at http://admin:pw@..."), and sent
    as HTTP Basic in place of the token, which the instance then refused (found by a trial)."""
    result = run("status", "--url", "http://admin:hunter2-secret-pw@127.0.0.1:9", "--token", TOKEN)
    assert result.code == 2
    assert one_line(result) == (
        "--url 'http://…@127.0.0.1:9' is not a usable URL: it holds a user name or password; give the"
        " management token with --token (or OMNIROUTE_MANAGEMENT_TOKEN)"
    )
    assert "hunter2" not in result.stdout + result.stderr


def echoing_app(kind: str) -> Starlette:
    """A server that quotes the Authorization header it was sent, in one `kind` of answer to every
    request: an error page (as debug pages do), a rejected field, a 403's reason, a 200's JSON
    (JSON-escaped), or an event of the live stream."""

    async def answer(request: Request) -> Response:
        sent = request.headers.get("authorization", "")
        if kind == "page500":
            return PlainTextResponse(f"<html>headers: {sent}</html>", status_code=500)
        if kind == "fields400":
            return JSONResponse(
                {"error": {"message": "bad", "fields": [{"field": "x", "message": sent}]}}, 400
            )
        if kind == "forbidden403":
            return JSONResponse({"error": {"message": f"forbidden for {sent}"}}, 403)
        if kind == "stream":
            data = json.dumps(
                {"seq": 1, "ts": 0, "layer": "breaker", "key": sent, "from": "A", "to": "B", "reason": "x"}
            )
            return Response(f"id: 1\nevent: event\ndata: {data}\n\n", media_type="text/event-stream")
        document = {"providerBreakers": [{"echo": sent}]}
        return Response(json.dumps(document).replace("/", "\\/"), media_type="application/json")

    return Starlette(
        routes=[Route("/{path:path}", answer, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])]
    )


@pytest.mark.parametrize(
    ("kind", "args"),
    [
        pytest.param("page500", ["status"], id="500-page"),
        pytest.param(
            "fields400", ["settings", "set", "requestQueue.autoEnableApiKeyProviders=false"], id="400-fields"
        ),
        pytest.param("forbidden403", ["lockouts"], id="403"),
        pytest.param("json200", ["breakers", "--json"], id="200-json"),
        pytest.param("stream", ["events", "--follow", "--json"], id="stream"),
    ],
)
def test_a_server_echoing_the_token_never_gets_it_printed(kind: str, args: list[str]) -> None:
    """Debug pages and proxies quote the headers they were sent: the CLI's own token is its secret
    too, and leaves by no door (stdout, stderr), whatever a server answers."""
    token = "Echo/Token+0123456789"
    with serve(echoing_app(kind)) as server:
        result = run(*args, "--url", server.url, env={"OMNIROUTE_MANAGEMENT_TOKEN": token})
    printed = result.stdout + result.stderr
    assert token not in printed and token.replace("/", "\\/") not in printed, printed
    assert "***" in printed, printed
