"""Relaying a streamed Messages reply to the client, and Anthropic's error shape.

Both relays forward what one read of the upstream brought in one write, read the reply
as it passes (proxy/surfaces/messages_reply.py), and hold back the final
``message_stop`` until ``store(record, usage)`` has stored the turn: a client that saw
``message_stop`` can count on it. A stream always ends with ``message_stop`` or an
``error`` event.

- ``relay_native``: Anthropic's own events, forwarded byte for byte.
- ``relay_translated``: a chat completions stream, translated event by event
  (proxy/surfaces/messages_translate.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from proxy.errors import ProxyError, UpstreamError, UpstreamReplyError, UpstreamStatusError
from proxy.surfaces.chat_reply import ReplyAccumulator, add_stream_event
from proxy.surfaces.messages_reply import NOT_A_MESSAGE, MessageAccumulator, store_usage
from proxy.surfaces.messages_translate import ChunkTranslator, normalized_reply
from proxy.upstreams.base import UpstreamStream

logger = logging.getLogger("memory_proxy.messages")

Store = Callable[[dict[str, Any], dict[str, Any] | None], Awaitable[None]]

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 529: "overloaded_error"}
SERVER_ERROR = orjson.dumps({"type": "error", "error": {
    "type": "api_error", "message": "internal error in memory-proxy"}})


class UpstreamCut(UpstreamError):
    code = "upstream_stream_cut"


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(exc: ProxyError) -> bytes:
    """``exc`` in Anthropic's shape: an Anthropic error from the upstream as it came (its
    secrets masked), any other with the type Anthropic gives its status."""
    message = exc.message
    if isinstance(exc, UpstreamStatusError):
        try:
            data = orjson.loads(exc.raw_body)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict) and data.get("type") == "error" and isinstance(
            data.get("error"), dict
        ):
            return exc.raw_body
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]  # an OpenAI-shaped error of a translated upstream
        elif exc.raw_body:
            message = exc.raw_body.decode("utf-8", "replace")[:2000]
    return orjson.dumps({"type": "error", "error": {
        "type": error_type(exc.status_code), "message": message}})


def error_event(body: bytes) -> bytes:
    return b"event: error\ndata: " + body + b"\n\n"


async def relay_native(stream: UpstreamStream, store: Store | None) -> AsyncIterator[bytes]:
    """Anthropic's events as they come; ``store`` None: a pass-through (nothing read)."""
    accumulator = MessageAccumulator()
    ready = getattr(stream, "ready", None)
    held: bytes | None = None
    try:
        try:
            async for first in stream:
                out: list[bytes] = []
                for event in (first, *ready()) if ready is not None else (first,):
                    if not event.data:
                        if event.raw.endswith(b"\n"):
                            out.append(event.raw)  # a comment or a bare event line
                        continue
                    if store is not None:
                        try:
                            accumulator.add_data(event.data)
                        except UpstreamReplyError:
                            if out:
                                yield b"".join(out)
                            raise
                        if accumulator.complete and held is None:
                            held = event.raw  # message_stop: after the turn is stored
                            continue
                    out.append(event.raw)
                if out:
                    yield b"".join(out)
            if store is None:
                return
            if accumulator.error is not None:
                return  # the upstream's error event went out as it came; nothing stored
            record = accumulator.record()
            if record is None:
                raise UpstreamReplyError(f"{NOT_A_MESSAGE} (a stream without a message)")
            if held is None:
                raise UpstreamCut("upstream stream ended before the reply was complete")
            await store(record, store_usage(accumulator.usage))
        except ProxyError as exc:
            logger.warning("messages stream ended with an error: %s", exc.message)
            yield error_event(error_body(exc))
            return
        yield held
    finally:
        await stream.aclose()


async def relay_translated(
    stream: UpstreamStream, model: str, store: Store | None
) -> AsyncIterator[bytes]:
    """A chat completions stream as Anthropic's events."""
    translator = ChunkTranslator(model)
    accumulator = ReplyAccumulator()
    ready = getattr(stream, "ready", None)
    done = False
    try:
        try:
            async for first in stream:
                out: list[bytes] = []
                for event in (first, *ready()) if ready is not None else (first,):
                    if event.done:
                        done = True
                        break
                    if not event.data:
                        continue
                    try:
                        chunk = add_stream_event(accumulator, event.data)
                    except UpstreamReplyError:
                        if out:
                            yield b"".join(out)
                        raise
                    out.extend(translator.feed(chunk))
                if out:
                    yield b"".join(out)
                if done:
                    break
            if not done and not accumulator.complete:
                raise UpstreamCut("upstream stream ended before the reply was complete")
            closing = translator.finish()
            reply = normalized_reply(accumulator.message())
            if reply is None:
                raise UpstreamReplyError(f"{NOT_A_MESSAGE} (a stream without a reply)")
            if store is not None:
                # after hidden built-in rounds, the first round's (proxy/tools/stream.py)
                await store(reply, getattr(stream, "memory_usage", None) or accumulator.usage)
        except ProxyError as exc:
            logger.warning("messages stream ended with an error: %s", exc.message)
            yield error_event(error_body(exc))
            return
        yield b"".join(closing)
    finally:
        await stream.aclose()
