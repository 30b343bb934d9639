"""A target's name (`provider/model`), made once with the target: the same as writing it out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.engine import Target

_part = st.text(min_size=1, max_size=20)


@given(_part, _part, st.one_of(st.none(), _part))
def test_a_targets_name_is_provider_slash_model_and_changes_nothing_else(
    provider: str, model: str, connection: str | None
) -> None:
    target = Target(provider, model, connection)
    assert target.name == f"{provider}/{model}" == str(target)
    twin = Target(provider, model, connection)
    assert twin == target and hash(twin) == hash(target)
    assert (Target(provider, model, None) == Target(provider, model, connection)) is (connection is None)
    assert repr(target) == f"Target(provider={provider!r}, model={model!r}, connection_id={connection!r})"
