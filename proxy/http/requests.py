"""Reading request bodies: size-limited, parsed with orjson, errors in OpenAI's shape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from starlette.requests import Request
from starlette.types import Receive

from proxy.errors import BadRequest, ClientDisconnected, PayloadTooLarge


async def read_body(request: Request, limit: int) -> bytes:
    return await receive_body(request.receive, request.headers.get("content-length"), limit)


async def receive_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The request body from its ASGI messages, refused past ``limit`` bytes (at once when
    the declared Content-Length says so)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body exceeds the {limit} byte limit")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("the client closed the connection mid-request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit} byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# the deepest nesting orjson writes
MAX_NESTING = 254


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise BadRequest("request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson refuses numbers beyond a double, lone surrogates and nesting past 1024
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    if raw.count(b"[") + raw.count(b"{") <= MAX_NESTING:
        return data  # too few brackets to nest deeper (counting them is cheap; writing a
        # large body out to see costs as much as reading it, on the event loop)
    try:
        # the body is re-serialized on its way upstream and into the store; orjson writes
        # at most 254 levels of nesting, so a deeper body is refused here, not with a 500
        orjson.dumps(data)
    except orjson.JSONEncodeError:
        raise BadRequest("request body is nested too deeply", code="invalid_json") from None
    return data


# characters of new input (text, inline media, tool call arguments) past which a turn reads
# it on a thread: tokenizing a long text, decoding and hashing media hold the loop otherwise
LARGE_INPUT = 256 * 1024


def is_large(messages: Sequence[Mapping[str, Any]]) -> bool:
    """The messages hold ``LARGE_INPUT`` characters or more (a measure, not exact)."""
    size = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            size += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping):
                    size += _strings(part) + sum(
                        _strings(v) for v in part.values() if isinstance(v, Mapping))
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                size += _strings(function)
        if size >= LARGE_INPUT:
            return True
    return False


def _strings(values: Mapping[str, Any]) -> int:
    return sum(len(v) for v in values.values() if isinstance(v, str))
