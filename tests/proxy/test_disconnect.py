"""The watch on a non-streaming call: it starts ``WATCH_AFTER_SECONDS`` into the call, so a
call that answers sooner reads nothing from the client, and a client that left before
the watch started is still noticed when it does."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.errors import ClientDisconnected
from proxy.http.disconnect import WATCH_AFTER_SECONDS, unless_disconnected


class Client:
    """An ASGI ``receive`` after the body was read: ``http.disconnect`` once ``gone``."""

    def __init__(self, gone: bool = False) -> None:
        self.reads = 0
        self.left = asyncio.Event()
        if gone:
            self.left.set()

    async def receive(self) -> dict[str, str]:
        self.reads += 1
        await self.left.wait()
        return {"type": "http.disconnect"}


async def test_a_call_that_answers_before_the_watch_starts_reads_nothing_from_the_client():
    client = Client(gone=True)

    async def instant() -> str:
        await asyncio.sleep(0)
        return "reply"

    assert await unless_disconnected(client.receive, instant()) == "reply"
    await asyncio.sleep(WATCH_AFTER_SECONDS * 2)  # the cancelled timer never fires
    assert client.reads == 0


async def test_a_client_gone_before_the_watch_starts_cancels_the_call_when_it_starts():
    client = Client(gone=True)
    cancelled = asyncio.Event()

    async def slow() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "reply"

    started = time.monotonic()
    with pytest.raises(ClientDisconnected):
        await unless_disconnected(client.receive, slow())
    assert cancelled.is_set()
    # not before the watch started (a loop's timers may round to the millisecond)
    assert WATCH_AFTER_SECONDS - 0.002 <= time.monotonic() - started < 5
    assert client.reads == 1


async def test_a_slow_call_whose_client_stays_answers_and_leaves_no_watch_behind():
    client = Client()

    async def slow() -> str:
        await asyncio.sleep(WATCH_AFTER_SECONDS * 3)
        return "reply"

    assert await unless_disconnected(client.receive, slow()) == "reply"
    assert client.reads == 1  # watched once it ran past the delay
    await asyncio.sleep(0)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert pending == []


async def test_a_client_leaving_during_a_watched_call_cancels_it():
    client = Client()

    async def leave_later() -> None:
        await asyncio.sleep(WATCH_AFTER_SECONDS * 2)
        client.left.set()

    async def slow() -> str:
        await asyncio.sleep(30)
        return "reply"

    leaving = asyncio.ensure_future(leave_later())
    with pytest.raises(ClientDisconnected):
        await asyncio.wait_for(unless_disconnected(client.receive, slow()), 5)
    await leaving
