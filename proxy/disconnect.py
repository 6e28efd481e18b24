"""Stop waiting on the upstream for a client that has gone away.

A streamed reply notices a disconnect through ``StreamingResponse``; a non-streaming call
(or a stream whose headers are slow to come) would otherwise run to the end and store a
turn nobody received. ``unless_disconnected`` races the call against the ASGI
``http.disconnect`` message and cancels it, which aborts the upstream connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from proxy.errors import ProxyError

T = TypeVar("T")


class ClientDisconnected(ProxyError):
    """The client closed the connection; the answer goes nowhere (nginx's 499)."""

    status_code = 499
    error_type = "client_closed_request"
    code = "client_disconnected"


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive | None, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``; cancel it and raise ``ClientDisconnected`` if the client goes
    away first. Only for a request whose body has been read in full."""
    if receive is None:
        return await awaitable
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_disconnected(receive))
    # a done callback instead of asyncio.wait: no extra futures on every request
    watch.add_done_callback(lambda done: done.cancelled() or work.cancel())
    try:
        return await work
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if watch.done() and not watch.cancelled() and not (task and task.cancelling()):
            raise ClientDisconnected("the client closed the connection before the reply") from None
        raise
    finally:
        watch.cancel()
