"""`omniroute requests` and `omniroute stats`: against an in-process instance, and against a real
`omniroute serve` process whose traffic falls back from a dead upstream to a live one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from tests.cli.conftest import Instance, run
from tests.fakes import FakeUpstream, Reply, serve
from tests.instances import OMNIROUTE, environment, free_port
from tests.instances import wait_until_serving as serving_on
from tests.integration.test_proxy import wait_until

CHAT = "/v1/chat/completions"


def chat(url: str, model: str, **extra: object) -> httpx.Response:
    return httpx.post(url + CHAT, json={"model": model, "messages": [], **extra}, timeout=10)


def alive(url: str) -> list[object]:
    found: list[object] = httpx.get(url + "/api/requests?state=alive", timeout=10).json()["requests"]
    return found


def test_requests_json_is_the_records_oldest_first_and_limit_keeps_the_newest(proxy: Instance) -> None:
    ids = [chat(proxy.url, "alpha/m1").headers["x-request-id"] for _ in range(3)]
    chat(proxy.url, "nobody/none")
    records = proxy.cli("requests", "--json").json()
    assert [r["id"] for r in records[:3]] == ids
    assert records == proxy.api("/api/requests")["requests"]
    newest = proxy.cli("requests", "--limit", "2", "-o", "json").json()
    assert [r["seq"] for r in newest] == [3, 4]
    failed = proxy.cli("requests", "--failed", "--json").json()
    assert [(r["status"], r["code"]) for r in failed] == [(404, "model_not_found")]


def test_requests_table_says_where_each_went(proxy: Instance) -> None:
    chat(proxy.url, "alpha/m1")
    chat(proxy.url, "nobody/none")
    result = proxy.cli("requests")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("alpha/m1" in line and "alpha/alpha-1" in line and " 200 " in line for line in lines)
    assert any("nobody/none" in line and "404 model_not_found" in line for line in lines)


def test_requests_with_nothing_says_so_on_stderr(proxy: Instance) -> None:
    result = proxy.cli("requests", "--failed")
    assert (result.code, result.stdout) == (0, "")
    assert "No failed request in the trail." in result.stderr
    assert proxy.cli("requests", "--limit", "0").code == 2


def test_the_tables_show_the_last_5_minutes_like_the_console(proxy: Instance) -> None:
    from omniroute_tui.snapshot import COLUMNS

    assert chat(proxy.url, "alpha/m1").status_code == 200
    result = proxy.cli("connections")
    alpha = next(
        line for line in result.stdout.splitlines() if line.startswith("alpha ") and "alpha-1" in line
    )
    assert alpha.split()[-3:] == ["0%", "of", "1"] and alpha.split()[-4] == "ms"
    breakers = proxy.cli("breakers").stdout
    assert "0% of 1" in next(line for line in breakers.splitlines() if line.startswith("alpha"))
    titles = [t for t in proxy.cli("requests").stdout.splitlines()[0].strip().split("  ") if t]
    assert [" ".join(t.split()) for t in titles] == [c.label for c in COLUMNS["requests"]]


def test_stats_json_is_the_document_and_a_bad_window_is_a_usage_error(proxy: Instance) -> None:
    chat(proxy.url, "alpha/m1")
    doc = proxy.cli("stats", "--window", "1m", "--json").json()
    assert doc == proxy.api("/api/stats?window=1m")
    assert doc["providers"]["alpha"]["requests"] == 1
    human = proxy.cli("stats")
    assert human.code == 0 and "last 5m" in human.stdout and "alpha-1" in human.stdout
    bad = proxy.cli("stats", "--window", "2m")
    assert bad.code == 2 and "window" in bad.stderr and "1m, 5m, 15m" in bad.stderr
    fleet = proxy.cli("stats", "--fleet", "--json").json()
    assert fleet == proxy.api("/api/stats?scope=fleet")
    assert fleet["replicas"]["summed"] == ["local"] and fleet["providers"]["alpha"]["requests"] == 1
    assert "fleet of 1 replica" in proxy.cli("stats", "--fleet").stdout


def test_against_a_real_serve_the_trail_shows_the_fallback(tmp_path: Path) -> None:
    fake = FakeUpstream("live")
    with serve(fake.app) as live:
        port = free_port()
        config = tmp_path / "config.toml"
        config.write_text(
            f"[server]\nport = {port}\n"
            f'[providers.dead]\nclass = "local"\nbase_url = "{FakeUpstream.refused_url()}"\n'
            '[[providers.dead.connections]]\nid = "dead-1"\n'
            f'[providers.live]\nclass = "local"\nbase_url = "{live.url}/v1"\n'
            '[[providers.live.connections]]\nid = "live-1"\n'
            '[combos.both]\nstrategy = "priority"\ntargets = ["dead/m1", "live/m1"]\n'
        )
        config.chmod(0o600)
        log = tmp_path / "serve.log"
        command = [*OMNIROUTE, "serve", "--config", str(config), "--state", str(tmp_path / "s.db")]
        with open(log, "w") as stderr:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=environment())
        try:
            serving_on(proc, port, log)  # type: ignore[arg-type]
            url = f"http://127.0.0.1:{port}"
            first = chat(url, "both")
            assert first.status_code == 200
            fake.default(Reply("stream", chunks=3))
            second = chat(url, "both", stream=True, stream_options={"include_usage": True})
            assert second.status_code == 200
            # (the client has a stream's last byte a moment before its record ends)
            wait_until(lambda: not alive(url), what="the stream's record to end")
            records = run("requests", "--json", "--url", url).json()
            assert [r["id"] for r in records] == [
                first.headers["x-request-id"],
                second.headers["x-request-id"],
            ]
            one, two = records
            assert [(a["connectionId"], a["outcome"]) for a in one["attempts"]] == [
                ("dead-1", "fallback"),
                ("live-1", "ok"),
            ]
            assert one["attempts"][0]["status"] is None and "refused" in one["attempts"][0]["reason"]
            assert one["usage"] == {"promptTokens": 5, "completionTokens": 4, "totalTokens": 9}
            # the dead connection cools after its failure: the stream passes over it (a skip)
            assert [s["connectionId"] for s in two["skipped"]] == ["dead-1"]
            assert two["skipped"][0]["reason"].startswith("cooling ")
            assert (two["stream"], two["state"], two["usage"]["totalTokens"]) == (True, "done", 9)
            assert two["ttftMs"] is not None
            stats = run("stats", "--json", "--url", url).json()
            assert stats["providers"]["live"]["requests"] == 2
            metrics = httpx.get(url + "/metrics", timeout=10)
            assert 'omniroute_fallbacks_total{provider="dead"} 1.0' in metrics.text
        finally:
            proc.terminate()
            proc.wait(timeout=20)
