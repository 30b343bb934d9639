"""`omniroute requests` at an ordinary terminal width, with one client-chosen long model name.

One request whose model was long made the Model column take 48 cells, and at 100 columns every
row's Status was cut to `2…` / `4…`; at 80 only Time, Id and Model were printed at all: an operator
could no longer see which requests failed (found by a docs trial).
"""

from __future__ import annotations

import httpx
import pytest

from tests.cli.conftest import Instance, run


def chat(url: str, model: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={"model": model, "messages": []}, timeout=10)


@pytest.mark.parametrize("columns", ["80", "100", "120"])
def test_a_long_model_name_leaves_every_rows_status_readable(proxy: Instance, columns: str) -> None:
    assert chat(proxy.url, "alpha/" + "x" * 200).status_code == 200
    assert chat(proxy.url, "alpha/m1").status_code == 200
    assert chat(proxy.url, "nobody/none").status_code == 404
    result = run("requests", "--url", proxy.url, env={"COLUMNS": columns})
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= int(columns)
    short = next(line for line in lines if "alpha/m1" in line)
    missing = next(line for line in lines if "nobody/none" in line)
    assert " 200" in short, result.stdout
    assert "404" in missing, result.stdout
    assert len(lines) == 2 + 3, result.stdout  # a line a request: nothing wraps
