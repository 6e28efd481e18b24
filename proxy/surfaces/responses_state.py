"""Stored responses: the proxy's response ids and the endpoints that read them
(``GET /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``,
``DELETE /v1/responses/{id}``).

A response id names its session: ``resp_`` + 24 random hex digits + the agent and the
session, base64url-encoded. The session's namespace is the caller's API key's, so a key
never finds another key's responses; the store maps the id to the seqs of the turn write
that made it (``Store.find_response``). A response is the reply record at its last seq;
its input items are the messages of that write before it (the turn's new input, not the
history a ``previous_response_id`` chain supplied).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import BadRequest, NotFound, StoreUnavailableError
from proxy.http.responses import json_response
from proxy.services import Services
from proxy.surfaces.responses_items import to_items
from proxy.surfaces.responses_reply import ECHOED, output_items
from proxy.turn.identity import client_key, namespace_for
from storage.base import StoreUnavailable
from strategies.records import ResponseRef, SessionKey, StoredMessage

__all__ = [
    "RESPONSE_META",
    "delete_response",
    "get_response",
    "list_input_items",
    "new_response_id",
    "response_session",
]

RESPONSE_META = "response"  # the reply record's meta: what the response held besides output
_RANDOM_HEX = 24


def new_response_id(agent: str, session: str) -> str:
    names = f"{agent}\x1f{session}".encode()
    encoded = base64.urlsafe_b64encode(names).rstrip(b"=").decode()
    return f"resp_{secrets.token_hex(_RANDOM_HEX // 2)}{encoded}"


def response_session(response_id: str) -> tuple[str, str] | None:
    """The agent and session a proxy response id names, None for anything else."""
    if not isinstance(response_id, str) or not response_id.startswith("resp_"):
        return None
    encoded = response_id[5 + _RANDOM_HEX :]
    if not encoded or len(encoded) > 400:
        return None
    try:
        names = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    agent, sep, session = names.partition("\x1f")
    return (agent, session) if sep and agent and session else None


def not_found(response_id: str) -> NotFound:
    return NotFound(
        f"Response with id '{response_id[:200]}' not found.", param="response_id",
        code="response_not_found",
    )


async def find(
    services: Services, headers: Any, response_id: str
) -> tuple[SessionKey, ResponseRef]:
    names = response_session(response_id)
    if names is None:
        raise not_found(response_id)
    key = SessionKey(namespace_for(client_key(headers)), *names)
    try:
        ref = await services.store.find_response(key, response_id)
    except StoreUnavailable as exc:
        raise StoreUnavailableError(f"memory store unavailable: {exc}") from exc
    if ref is None:
        raise not_found(response_id)
    return key, ref


def stored_response(response_id: str, reply: StoredMessage) -> dict[str, Any]:
    """A stored reply record as its response object."""
    kept = dict(reply.meta.get(RESPONSE_META) or {})
    out: dict[str, Any] = {
        "id": response_id, "object": "response",
        "created_at": kept.get("created_at") or int(reply.created_at),
        "status": kept.get("status", "completed"), "background": False, "error": None,
        "incomplete_details": kept.get("incomplete_details"),
        "model": kept.get("model") or reply.meta.get("model", ""),
    }
    for name, default in ECHOED.items():
        out[name] = kept.get(name, default)
    message = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
    out["output"] = output_items(message, response_id.removeprefix("resp_")[:_RANDOM_HEX])
    out["usage"] = kept.get("usage")
    return out


async def read_messages(
    services: Services, key: SessionKey, ref: ResponseRef
) -> list[StoredMessage]:
    try:
        return await services.store.get_messages(
            key, list(range(ref.first_seq, ref.seq + 1))
        )
    except StoreUnavailable as exc:
        raise StoreUnavailableError(f"memory store unavailable: {exc}") from exc


async def get_response(request: Request) -> Response:
    services: Services = request.app.state.services
    response_id = request.path_params["response_id"]
    key, ref = await find(services, request.headers, response_id)
    messages = await read_messages(services, key, ref)
    if not messages or messages[-1].role != "assistant":
        raise not_found(response_id)
    return json_response(stored_response(response_id, messages[-1]))


async def delete_response(request: Request) -> Response:
    services: Services = request.app.state.services
    response_id = request.path_params["response_id"]
    key, _ = await find(services, request.headers, response_id)
    try:
        await services.store.forget_response(key, response_id)
    except StoreUnavailable as exc:
        raise StoreUnavailableError(f"memory store unavailable: {exc}") from exc
    return json_response({"id": response_id, "object": "response.deleted", "deleted": True})


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    if not value.isdigit() or not 1 <= int(value) <= 100:
        raise BadRequest("'limit' must be an integer from 1 to 100", param="limit")
    return int(value)


async def list_input_items(request: Request) -> Response:
    services: Services = request.app.state.services
    response_id = request.path_params["response_id"]
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("'order' must be 'asc' or 'desc'", param="order")
    limit = _limit(request.query_params.get("limit"))
    key, ref = await find(services, request.headers, response_id)
    messages = await read_messages(services, key, ref)
    inputs = [m for m in messages if m.seq < ref.seq]
    items: list[dict[str, Any]] = []
    for message in inputs:
        rendered = to_items(
            [{"role": message.role, "content": message.content,
              "tool_calls": message.tool_calls, "tool_call_id": message.tool_call_id}]
        )
        for index, item in enumerate(rendered):
            if isinstance(item.get("content"), str):  # listed with parts, as OpenAI does
                kind = "output_text" if item.get("role") == "assistant" else "input_text"
                item = {**item, "content": [{"type": kind, "text": item["content"]}]}
            items.append({"id": f"item_{message.seq}_{index}", **item})
    if order == "desc":
        items.reverse()
    after = request.query_params.get("after")
    if after:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return json_response({
        "object": "list", "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    })
