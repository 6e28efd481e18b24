"""Bounds on what a client chooses, checked before any memory work.

Identifier-like strings (the model, message and tool names, tool call ids) key the
process's caches (tokenizers, model info, name token counts, tool token counts) and sit
in the session cache: each is at most ``MAX_IDENTIFIER_CHARS`` characters, or the request
is a 400 naming the field (OpenAI's own ``string_above_max_length``). The optional limits
of ``Settings`` (messages per request, forwarded header bytes, sessions per API key)
answer with their own 4xx.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.errors import BadRequest, HeadersTooLarge, TooManySessions
from proxy.settings import Settings
from storage.base import Store

# model ids, names and ids of every provider fit with room to spare (OpenAI: 64 for names)
MAX_IDENTIFIER_CHARS = 256


def _bounded(value: Any, param: str) -> None:
    if isinstance(value, str) and len(value) > MAX_IDENTIFIER_CHARS:
        raise BadRequest(
            f"Invalid '{param}': string too long. Expected a string with maximum length "
            f"{MAX_IDENTIFIER_CHARS}, but got a string with length {len(value)} instead.",
            param=param,
            code="string_above_max_length",
        )


def _function_name(holder: Any, param: str) -> None:
    if isinstance(holder, Mapping):
        function = holder.get("function")
        if isinstance(function, Mapping):
            _bounded(function.get("name"), f"{param}.function.name")
        _bounded(holder.get("name"), f"{param}.name")


def check_message_identifiers(message: Mapping[str, Any], param: str) -> None:
    """A 400 for an identifier-like field of one message past ``MAX_IDENTIFIER_CHARS``
    (called by ``history_sync.validate_messages`` for every message that has any, after
    its shape checks)."""
    _bounded(message.get("name"), f"{param}.name")
    _bounded(message.get("tool_call_id"), f"{param}.tool_call_id")
    for number, call in enumerate(message.get("tool_calls") or ()):
        _bounded(call.get("id"), f"{param}.tool_calls[{number}].id")
        _function_name(call, f"{param}.tool_calls[{number}]")


def check_identifiers(body: Mapping[str, Any]) -> None:
    """A 400 for an identifier-like field of the body past ``MAX_IDENTIFIER_CHARS``: the
    model, tool definition names and ``tool_choice`` (the messages' own are checked as
    they are validated)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    _bounded(model, "model")
    tools = body.get("tools")
    if isinstance(tools, list):
        for number, tool in enumerate(tools):
            _function_name(tool, f"tools[{number}]")
    _function_name(body.get("tool_choice"), "tool_choice")


def check_limits(
    settings: Settings, messages: list[dict[str, Any]], forwarded: Mapping[str, str]
) -> None:
    """The optional limits of ``Settings`` (0 turns one off)."""
    most = settings.max_messages_per_request
    if most and len(messages) > most:
        raise BadRequest(
            f"'messages' has {len(messages)} messages; this proxy takes at most {most} per "
            "request (MEMORY_PROXY_MAX_MESSAGES_PER_REQUEST)",
            param="messages",
            code="too_many_messages",
        )
    limit = settings.max_forwarded_header_bytes
    if limit:
        size = sum(len(name) + len(value) for name, value in forwarded.items())
        if size > limit:
            raise HeadersTooLarge(
                f"the headers forwarded upstream ({', '.join(forwarded)}) take {size} bytes; "
                f"this proxy takes at most {limit} (MEMORY_PROXY_MAX_FORWARDED_HEADER_BYTES)"
            )


async def check_new_session(settings: Settings, store: Store, namespace: str) -> None:
    """Before a turn creates a session: refused (403) when its API key already has
    ``max_sessions_per_key`` sessions (one store count; 0: no limit)."""
    most = settings.max_sessions_per_key
    if not most:
        return
    count = await store.count_sessions(namespace)
    if count >= most:
        raise TooManySessions(
            f"this API key has {count} sessions, the most this proxy keeps per key "
            f"(MEMORY_PROXY_MAX_SESSIONS_PER_KEY); delete some or use an existing session"
        )
