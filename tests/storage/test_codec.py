"""The stored message encoding shared by the backends (storage/codec.py): what is encoded
decodes to the same record, and a body written by an earlier version (other keys) still
decodes."""

from __future__ import annotations

import orjson
import pytest

from storage.codec import encode_message, message_from_body, message_from_placed_body
from strategies.records import StoredMessage


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(StoredMessage("user", "hi", 3, "f1", created_at=5.0), id="plain"),
        pytest.param(StoredMessage("assistant", None, 4, "f2", tool_calls=[{"id": "c"}],
                                   created_at=6.0), id="tool-calls"),
        pytest.param(StoredMessage("tool", "ok", 1, "f3", tool_call_id="c", created_at=7.0),
                     id="tool-result"),
        pytest.param(StoredMessage("user", [{"type": "text", "text": "x"}], 2, "f4",
                                   name="ann", meta={"parts": ["p"]}, created_at=8.0),
                     id="parts-name-meta"),
    ],
)
def test_an_encoded_message_decodes_to_the_same_record(message: StoredMessage) -> None:
    body = orjson.loads(encode_message(message, now=1.0))

    decoded = message_from_body(body, 9, "chain", "stub")

    expected = StoredMessage(
        message.role, message.content, message.tokens, message.fingerprint,
        message.tool_calls, message.tool_call_id, message.name, "stub", message.meta, 9,
        "chain", message.created_at,
    )  # fmt: skip
    assert decoded == expected
    # a body that holds its seq and chain (as Redis stores it) decodes the same
    placed = {"seq": 9, "chain": "chain", **orjson.loads(encode_message(message, now=1.0))}
    assert message_from_placed_body(placed, "stub") == expected


def test_a_placed_body_of_other_keys_decodes_what_it_holds() -> None:
    # seven keys, as a placed body has, but a name where its chain would be
    body = {"seq": 4, "role": "user", "content": "x", "tokens": 2, "fingerprint": "f",
            "created_at": 3.0, "name": "ann"}

    decoded = message_from_placed_body(body, None)

    assert (decoded.seq, decoded.chain, decoded.name, decoded.created_at) == (4, "", "ann", 3.0)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"role": "user", "content": "x", "tokens": 2, "fingerprint": "f",
                      "meta": {"k": 1}}, id="meta-without-created-at"),
        pytest.param({"role": "user", "content": "x", "tokens": 2, "fingerprint": "f",
                      "name": "ann"}, id="name-without-created-at"),
        pytest.param({"role": "user", "content": "x", "tokens": 2}, id="fewer-keys"),
    ],
)
def test_a_body_of_other_keys_decodes_what_it_holds(body: dict[str, object]) -> None:
    decoded = message_from_body(body, 1, "c", None)

    assert (decoded.role, decoded.content, decoded.tokens) == ("user", "x", 2)
    assert decoded.meta == body.get("meta", {}) and decoded.name == body.get("name")
    assert decoded.created_at == 0.0 and decoded.fingerprint == body.get("fingerprint", "")
