"""Stop waiting on the upstream for a client that has gone away.

A streamed reply watches its client while it streams (``StreamReply`` in proxy/http/asgi.py); a
non-streaming call (or a stream whose headers are slow to come) would otherwise run to the
end and store a turn nobody received. ``unless_disconnected`` races the call against the ASGI
``http.disconnect`` message and cancels it, which aborts the upstream connection.

The watch on a call ``unless_disconnected`` awaits (a non-streaming call, or the opening
of a stream) starts ``WATCH_AFTER_SECONDS`` into it: a model call takes far longer, and one
that answers sooner (a cached reply, an instant error) is not worth a task of its own. A
client that left meanwhile is noticed when the watch starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from proxy.errors import ClientDisconnected

T = TypeVar("T")

# how long a call awaited by ``unless_disconnected`` runs before the client is watched
WATCH_AFTER_SECONDS = 0.05


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class DisconnectWatch:
    """Cancels the current task when the client disconnects, until ``stop()``.

    One task (the watcher) per request instead of two: the work runs in the request's own
    task, and a flag keeps a disconnect noticed after ``stop()`` from cancelling it."""

    __slots__ = ("_active", "_receive", "_task", "_timer", "_watch")

    def __init__(self, receive: Receive, after: float = 0.0) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._active = True
        self._receive = receive
        self._watch: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        if after > 0:
            self._timer = asyncio.get_running_loop().call_later(after, self._start)
        else:
            self._start()

    def _start(self) -> None:
        self._timer = None
        if self._active:
            self._watch = asyncio.ensure_future(_disconnected(self._receive))
            self._watch.add_done_callback(self._on_done)

    def _on_done(self, watch: asyncio.Future[None]) -> None:
        if self._active and not watch.cancelled():
            self._task.cancel()

    def caused(self) -> bool:
        """True when a ``CancelledError`` being handled came from this watch alone (and
        takes the cancellation back); False for any other cancellation."""
        watch = self._watch
        if (
            watch is not None
            and watch.done()
            and not watch.cancelled()
            and self._task.cancelling() <= 1
        ):
            self._task.uncancel()
            return True
        return False

    def stop(self) -> None:
        self._active = False
        if self._timer is not None:
            self._timer.cancel()
        if self._watch is not None:
            self._watch.cancel()


async def unless_disconnected(receive: Receive | None, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``; cancel it and raise ``ClientDisconnected`` if the client goes
    away first. Only for a request whose body has been read in full."""
    if receive is None:
        return await awaitable
    watch = DisconnectWatch(receive, after=WATCH_AFTER_SECONDS)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if watch.caused():
            raise ClientDisconnected("the client closed the connection before the reply") from None
        raise
    finally:
        watch.stop()
