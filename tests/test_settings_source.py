"""One source for every default: a policy dataclass's field, and nothing else, says what a setting is.

Each case changes a default and a range in the dataclass alone, before anything reads it, in a
fresh interpreter (the schema is built once, at import), and checks that every place that shows the
setting follows: the API's document and its OpenAPI schema, the card, the validation message and
the docs' generated table.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_CHECK = """
from proxy.openapi import document
from proxy.settings import Settings, field
from omniroute_tui.cards.fields import make_field
from tests.doc_tables import settings_table

spec = field(PATH)
section, _, name = PATH.rpartition(".")
group = "settings" if PATH.startswith("modelLockout.") else "resilience"

doc = Settings().document(group)  # what GET /api/settings or /api/resilience serves on a fresh state
for part in section.split("."):
    doc = doc[part]
assert doc[name] == DEFAULT, doc

schema = document()["components"]["schemas"]["LockoutSettings" if group == "settings" else "ResilienceSettings"]
for part in section.split("."):
    schema = schema["properties"][part]
prop = schema["properties"][name]
assert (prop["default"], prop["maximum"]) == (DEFAULT, MAX), prop

hint = make_field(spec, DEFAULT, label=name)._hint  # the card's "default ... · range ..." line
assert hint == f"default {DEFAULT:,} · {spec.min:,}–{MAX:,}", hint

patch = {}
node = patch
for part in section.split("."):
    node = node.setdefault(part, {})
node[name] = MAX + 1
_, errors = Settings().validate(patch, group)
assert [(e.field, e.message) for e in errors] == [
    (PATH, f"must be an integer between {spec.min} and {MAX}")
], errors

prefix = PATH.split(".")[0]
assert f"`{DEFAULT}`" in settings_table(prefix) and f"–{MAX:,}" in settings_table(prefix)
print("ok")
"""

_FIELD_DEFAULT = """
import dataclasses, types
from proxy.resilience.lockout import LockoutSettings
f = next(f for f in dataclasses.fields(LockoutSettings) if f.name == "max_backoff_steps")
f.default = 7
f.metadata = types.MappingProxyType({**f.metadata, "max": 15})
PATH, DEFAULT, MAX = "modelLockout.maxBackoffSteps", 7, 15
"""

_PER_CLASS_DEFAULT = """
import dataclasses, types
from proxy.resilience import breaker
breaker.DEFAULT_BREAKER_POLICIES["apikey"] = dataclasses.replace(
    breaker.DEFAULT_BREAKER_POLICIES["apikey"], failure_threshold=13
)
f = next(f for f in dataclasses.fields(breaker.BreakerPolicy) if f.name == "failure_threshold")
f.metadata = types.MappingProxyType({**f.metadata, "max": 999})
PATH, DEFAULT, MAX = "providerBreaker.apikey.failureThreshold", 13, 999
"""


@pytest.mark.parametrize("change", [_FIELD_DEFAULT, _PER_CLASS_DEFAULT], ids=["field-default", "per-class"])
def test_a_default_changed_in_its_dataclass_shows_everywhere(change: str) -> None:
    script = textwrap.dedent(change) + textwrap.dedent(_CHECK)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
