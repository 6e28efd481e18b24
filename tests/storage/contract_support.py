"""What the Store contract's modules (``test_store_*_contract.py``,
``test_store_versions.py``) and the backend-specific tests (``test_store_backends.py``, the
Redis index and deployment tests) build their sessions from: one session key, messages
with the fingerprints a client's history would give them, their chain hashes, and an
append and a load that read as the turn they stand for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from storage.base import Store
from strategies.records import LoadSpec, SessionKey, StoredMessage, TurnWrite, chain_hash

KEY = SessionKey("ns-1", "agent-a", "session-1")


def message(role: str, text: str, **fields: object) -> StoredMessage:
    fingerprint = hashlib.sha1(f"{role}:{text}".encode()).hexdigest()
    return StoredMessage(role=role, content=text, fingerprint=fingerprint, **fields)  # type: ignore[arg-type]


def user(text: str) -> StoredMessage:
    return message("user", text, tokens=len(text))


def assistant(text: str, calls: Iterable[str] = ()) -> StoredMessage:
    tool_calls = [
        {"id": call, "type": "function", "function": {"name": "search", "arguments": "{}"}}
        for call in calls
    ]
    return message("assistant", text, tokens=len(text), tool_calls=tool_calls or None)


def tool(call_id: str, text: str) -> StoredMessage:
    return message("tool", text, tokens=len(text), tool_call_id=call_id)


def chains(messages: Iterable[StoredMessage], previous: str = "") -> list[str]:
    out = []
    for stored in messages:
        previous = chain_hash(previous, stored.fingerprint)
        out.append(previous)
    return out


async def append(
    store: Store, *messages: StoredMessage, key: SessionKey = KEY, **write: object
) -> list[int]:
    result = await store.append_turn(key, TurnWrite(list(messages), **write))  # type: ignore[arg-type]
    return result.seqs


async def load(store: Store, *, key: SessionKey = KEY, **spec: object) -> list[str]:
    snapshot = await store.load(key, LoadSpec(**spec))  # type: ignore[arg-type]
    return [stored.content for stored in snapshot.messages]


async def conversation(store: Store, turns: int) -> list[StoredMessage]:
    sent = []
    for i in range(turns):
        pair = [user(f"question {i}"), assistant(f"answer {i}")]
        await append(store, *pair)
        sent += pair
    return sent
