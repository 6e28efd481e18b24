"""Where a ``previous_response_id`` continues: a response's chain as the session log holds
it.

A response's turn write is a run of seqs in its session's log (``Store.find_response``).
Continuing from the session's latest response appends after it. Continuing from an
earlier one forks there: the active messages after it are superseded (kept in the log,
never sent again), as a rewind is (``prepare_turn(branch_at=...)``).

A response whose own messages a later fork superseded is on an abandoned branch. To
continue from it, its chain is walked back (each reply record keeps the
``previous_response_id`` it was made with) to the newest response still active; the
superseded writes after that one are appended again, as copies, before the new input:
the log then holds the branch as its active tail, the abandoned copies stay superseded.
This reads only the abandoned branch, once.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import StoreUnavailableError
from proxy.services import Services
from proxy.surfaces.responses_state import RESPONSE_META
from storage.base import StoreUnavailable
from strategies.records import ResponseRef, SessionKey, StoredMessage

__all__ = ["as_message", "branch_point"]

# how many responses back an abandoned branch is walked at most
MAX_WALK = 200


def as_message(record: StoredMessage) -> dict[str, Any]:
    """A stored record as the chat-format message it was stored from."""
    message: dict[str, Any] = {"role": record.role, "content": record.content}
    if record.tool_calls:
        message["tool_calls"] = record.tool_calls
    if record.tool_call_id:
        message["tool_call_id"] = record.tool_call_id
    if record.name:
        message["name"] = record.name
    return message


async def branch_point(
    services: Services, key: SessionKey, ref: ResponseRef
) -> tuple[int, list[dict[str, Any]]]:
    """The seq the turn continues after and the messages of an abandoned branch to append
    again before the new input (none when ``ref`` is still active)."""
    store = services.store
    replay: list[dict[str, Any]] = []
    try:
        for _ in range(MAX_WALK):
            if await store.get_range(key, ref.seq, ref.seq):
                return ref.seq, replay  # active: continue (or fork) here
            records = await store.get_messages(key, list(range(ref.first_seq, ref.seq + 1)))
            replay = [as_message(r) for r in records] + replay
            kept = records[-1].meta.get(RESPONSE_META) if records else None
            previous = kept.get("previous_response_id") if isinstance(kept, dict) else None
            found = await store.find_response(key, previous) if previous else None
            if found is None:
                # the branch began with this response: it continued what came before it
                return ref.first_seq - 1, replay
            ref = found
    except StoreUnavailable as exc:
        raise StoreUnavailableError(f"memory store unavailable: {exc}") from exc
    return ref.seq, replay
