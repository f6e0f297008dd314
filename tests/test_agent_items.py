"""Agent items as stored: exactly as the SDK wrote them, and old stored items read back as before."""

from __future__ import annotations

import json

import pytest
from golden.make_golden import GOLDEN_DIR
from hypothesis import given
from hypothesis import strategies as st

from convmem.errors import InvalidTurn
from convmem.events import ItemPopped, ItemsAdded, MessageItem, decode_event, decode_event_json

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@given(extra=st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=5))
def test_an_item_reads_back_with_its_keys_in_the_order_written(extra: dict[str, object]) -> None:
    """Whatever the keys and their order, to_agents gives back the same JSON text the caller had."""
    item = {**extra, "role": "user", "content": "hi"} if "role" not in extra else extra
    stored = MessageItem.from_agents(item)
    assert json.dumps(stored.to_agents()) == json.dumps(item)


def test_a_handoff_call_with_empty_arguments_is_accepted() -> None:
    """The SDK's handoff calls carry arguments ""; they are stored and read back as given."""
    item = {"type": "function_call", "call_id": "c1", "name": "transfer_to_billing", "arguments": ""}
    stored = MessageItem.from_agents(item)
    assert stored.arguments == ""
    assert stored.to_agents() == item


@pytest.mark.parametrize("arguments", [None, 3, {"city": "Oslo"}])
def test_call_arguments_must_be_a_string(arguments: object) -> None:
    """Arguments that are not a string are refused, naming the field."""
    item = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments}
    with pytest.raises(InvalidTurn, match=r"items\[2\]\.arguments"):
        MessageItem.from_agents(item, field="items[2]")


def test_items_stored_before_read_back_as_before() -> None:
    """Golden v1 items kept their keys sorted; they still decode and read back exactly so."""
    for path, decode in (
        (GOLDEN_DIR / "items.added.json", decode_event_json),
        (GOLDEN_DIR / "items.added.msgpack", decode_event),
    ):
        event = decode(path.read_bytes())
        assert isinstance(event, ItemsAdded)
        first = event.items[0].to_agents()
        assert list(first) == ["content", "role"]
        assert first == {"content": "Book it", "role": "user"}
    popped = decode_event((GOLDEN_DIR / "item.popped.msgpack").read_bytes())
    assert isinstance(popped, ItemPopped)
    assert popped.item.to_agents() == {"type": "web_search_call", "id": "ws_1"}
