"""The Redis store's values: a turn write as the append script's arguments, and the
scripts' replies as records (``storage/lua/*.lua`` say the shapes)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import Any

import orjson

from storage.codec import encode_message, message_from_placed_body
from strategies.records import RangeBudget, ResponseRef, SessionMeta, StoredMessage, TurnWrite

__all__ = [
    "append_args", "decode_array", "decode_messages", "decode_meta", "decode_response",
]


def append_args(write: TurnWrite, now: float, stamp: bytes) -> list[Any]:
    """The append script's ARGV (``storage/lua/append.lua``)."""
    fields: list[Any] = []
    for name, value in _meta_updates(write):
        fields += (name, value)
    args: list[Any] = [
        stamp,
        len(write.messages),
        "" if write.supersede_after is None else write.supersede_after,
        "" if write.supersede_until is None else write.supersede_until,
        len(fields) // 2,
        *fields,
    ]
    for message in write.messages:
        args += (
            message.fingerprint,
            message.role,
            message.tool_call_id if message.role == "tool" and message.tool_call_id else "",
            message.compressed_content or "",
            encode_message(message, now),
        )
    stubs = write.compressed or {}
    args.append(len(stubs))
    for seq, stub in stubs.items():
        args += (seq, stub or "")
    args.append(write.response_id or "")
    args.append(write.write_id)
    return args


def decode_response(response_id: str, value: bytes | None) -> ResponseRef | None:
    """A response's entry in its session's ``responses`` hash: first seq, last seq, time."""
    if value is None:
        return None
    first, seq, created = value.split()
    return ResponseRef(response_id, int(first), int(seq), float(created))


def _meta_updates(write: TurnWrite) -> Iterator[tuple[str, Any]]:
    if write.system_prompt is not None:
        yield "system_prompt", orjson.dumps(write.system_prompt)
    if write.system_tokens is not None:
        yield "system_tokens", write.system_tokens
    if write.model is not None:
        yield "model", write.model
    if write.calibration is not None:
        yield "calibration", float(write.calibration)



def decode_array(
    array: bytes, stubs: Sequence[bytes], budget: RangeBudget | None = None
) -> list[StoredMessage]:
    """Messages from a script's JSON array and its flat ``[seq, stub, ...]`` list; with
    ``budget``, the newest of them it holds (``Store.get_range``): the array is parsed
    whole, records are made for those only."""
    by_seq = {int(seq): stub.decode() for seq, stub in zip(stubs[::2], stubs[1::2], strict=True)}
    stub = by_seq.get
    if budget is None:
        return [message_from_placed_body(data, stub(data["seq"])) for data in orjson.loads(array)]
    return budget.take(
        message_from_placed_body(data, stub(data["seq"])) for data in reversed(orjson.loads(array))
    )


def decode_messages(
    messages: Sequence[bytes | None], stubs: Sequence[bytes | None]
) -> list[StoredMessage]:
    decoded = []
    for index, raw in enumerate(messages):
        if raw is None:
            continue
        data = orjson.loads(raw)
        stub = stubs[index] if index < len(stubs) else None
        if stub is not None:
            data["compressed_content"] = stub.decode()
        decoded.append(StoredMessage.from_dict(data))
    return decoded


def decode_meta(values: Sequence[bytes | None]) -> SessionMeta:
    """The meta from the scripts' ``HMGET meta unpack(META)``: values in field order,
    None for a field never written."""
    head, active, chain, user, boundary, prompt, system_tokens, calibration, model, created, \
        updated, version = values  # fmt: skip
    return SessionMeta(
        int(head or 0), int(active or 0), chain.decode() if chain else "", int(user or 0),
        int(boundary or 0), orjson.loads(prompt) if prompt else None, int(system_tokens or 0),
        float(calibration or 1.0), model.decode() if model else "", float(created or 0.0),
        float(updated or 0.0), int(version or 0),
    )  # fmt: skip


# the scripts read the meta in this order (META in lua/prelude.lua)
if tuple(f.name for f in fields(SessionMeta)) != (
    "head_seq", "active_count", "head_chain", "last_user_seq", "boundary_seq", "system_prompt",
    "system_tokens", "calibration", "model", "created_at", "updated_at", "version",
):  # fmt: skip
    raise ImportError(
        "SessionMeta fields changed: update META in storage/lua/prelude.lua and "
        "storage/redis_codec.py decode_meta"
    )
