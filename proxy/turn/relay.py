"""The relay step for a streamed reply: upstream events go to the client as they arrive
(those one read brought, in one write), rendered by the surface, while the reply record
is rebuilt from the upstream API's events (proxy/turn/upstream_api.py). The turn is stored
(``finish``) before the surface's final event, so a client that saw it can count on the
turn being stored; a failure ends the stream with the surface's error event instead.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from proxy.errors import UpstreamCut, UpstreamReplyError, as_proxy_error
from proxy.surfaces.base import Surface
from proxy.surfaces.chat_reply import NOT_A_COMPLETION
from proxy.turn.state import Turn
from proxy.turn.upstream_api import ChatReader, ReplyReader
from proxy.upstreams.base import UpstreamStream

logger = logging.getLogger("memory_proxy.relay")

# store the reply: (the reply message, its usage)
Finish = Callable[[dict[str, Any], dict[str, Any] | None], Awaitable[None]]


async def relay(
    surface: Surface,
    stream: UpstreamStream,
    turn: Turn | None,
    finish: Finish | None = None,
    reader: ReplyReader | None = None,
) -> AsyncIterator[bytes]:
    """The client's stream (``turn`` None: memory off, nothing read or stored); ``reader``
    reads the upstream API's events (chat completion chunks by default)."""
    accumulator = reader or ChatReader()
    ready = getattr(stream, "ready", None)
    try:
        try:
            async for first in stream:
                out: list[bytes] = []
                done = False
                try:
                    for event in (first, *ready()) if ready is not None else (first,):
                        data = event.data
                        chunk = None
                        if data[:1] == b"{":  # a chunk (the usual event): never [DONE]
                            if turn is not None:
                                chunk = accumulator.add(data)
                        elif event.done:
                            done = True
                            break
                        elif data and turn is not None:
                            accumulator.add(data)  # junk: raises
                        elif not event.raw.endswith(b"\n"):
                            continue  # an unterminated tail (not SSE): not an event
                        piece = surface.stream_event(turn, chunk, event)
                        if piece is not None:
                            out.append(piece)
                except Exception:
                    if out:  # what came before the event that failed still goes out
                        yield b"".join(out)
                    raise
                if out:
                    yield out[0] if len(out) == 1 else b"".join(out)
                if done:
                    break
            else:
                if turn is not None and not accumulator.complete:
                    if accumulator.reply() is None:
                        raise UpstreamReplyError(f"{NOT_A_COMPLETION} (a stream without a reply)")
                    raise UpstreamCut("upstream stream ended before the reply was complete")
            if turn is not None and finish is not None:
                reply = accumulator.reply()
                if reply is None:
                    raise UpstreamReplyError(f"{NOT_A_COMPLETION} (a stream without a reply)")
                await finish(reply, accumulator.usage)
        except Exception as exc:
            error = as_proxy_error(exc)
            if error is None:
                raise
            logger.warning("stream ended with an error: %s", error.message)
            yield surface.stream_error(error)
            return
        yield surface.stream_end(turn)
    finally:
        await stream.aclose()
