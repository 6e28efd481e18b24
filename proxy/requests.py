"""Reading request bodies: size-limited, parsed with orjson, errors in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.types import Receive

from proxy.disconnect import ClientDisconnected
from proxy.errors import BadRequest, PayloadTooLarge


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
    try:
        # the body is re-serialized on its way upstream and into the store; orjson writes
        # at most 254 levels of nesting, so a deeper body is refused here, not with a 500
        orjson.dumps(data)
    except orjson.JSONEncodeError:
        raise BadRequest("request body is nested too deeply", code="invalid_json") from None
    return data
