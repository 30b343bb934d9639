"""The documentation stands alone and tells the truth the code holds.

- Every generated table in docs/ is what `tests/doc_tables.py` renders from the code today.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_tables import DOCS, blocks, render

ROOT = Path(__file__).resolve().parent.parent


def _generated() -> list[tuple[str, str, str]]:
    return [
        (path.name, name, body)
        for path in sorted(DOCS.glob("*.md"))
        for name, body in blocks(path.read_text())
    ]


def test_docs_have_generated_tables() -> None:
    names = {name for _, name, _ in _generated()}
    assert {"settings providerBreaker", "settings modelLockout", "settings-env", "limits resilience"} <= names


@pytest.mark.parametrize(("doc", "name", "body"), _generated(), ids=lambda v: str(v)[:40])
def test_generated_table_matches_the_code(doc: str, name: str, body: str) -> None:
    assert body == render(name), f"docs/{doc}: table '{name}' is stale: run `python -m tests.doc_tables`"
