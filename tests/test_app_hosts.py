"""The end-to-end harness: one loopback server serves the app each test mounts on it, and
hands it back as a server's graceful stop would (requests finished, lifespan shut down,
what the app left running cancelled)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from servers import AppHost, AppHosts
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route


class Probe:
    """What happened to one app: started, stopped, a background task cancelled."""

    def __init__(self) -> None:
        self.started = self.stopped = self.cancelled = False
        self.release = threading.Event()  # lets the slow route finish


def make_app(name: str, probe: Probe) -> Starlette:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"{name} {request.state.greeting}")

    async def slow(request: Request) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            yield b"first "
            await asyncio.to_thread(probe.release.wait, 10)
            yield b"last"

        return StreamingResponse(body())

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            probe.cancelled = True
            raise

    async def spawn(request: Request) -> PlainTextResponse:
        request.app.state.task = asyncio.create_task(forever())
        return PlainTextResponse("spawned")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        probe.started = True
        yield {"greeting": "hello"}
        probe.stopped = True

    return Starlette(routes=[Route("/", hello), Route("/slow", slow), Route("/spawn", spawn)],
                     lifespan=lifespan)


@pytest.fixture
def host() -> Iterator[AppHost]:
    hosts = AppHosts()
    probe = Probe()
    borrowed = hosts.borrow(make_app("warm-up", probe))
    hosts.give_back(borrowed)
    yield borrowed
    hosts.close()


def test_apps_mounted_in_turn_each_serve_their_own_requests_with_their_lifespan(
    host: AppHost,
) -> None:
    first, second = Probe(), Probe()
    host.mount(make_app("first", first))
    with httpx.Client(base_url=host.base) as client:
        assert client.get("/").text == "first hello"  # the lifespan's state reaches requests
        host.unmount()
        assert first.started and first.stopped
        host.mount(make_app("second", second))
        assert client.get("/").text == "second hello"  # a kept-alive client too
    host.unmount()
    assert second.stopped


def test_unmount_waits_for_a_request_in_flight_before_the_lifespan_ends(host: AppHost) -> None:
    probe = Probe()
    host.mount(make_app("slow", probe))
    with httpx.Client(base_url=host.base) as client, client.stream("GET", "/slow") as response:
        chunks = response.iter_bytes()
        assert next(chunks) == b"first "
        stopping = threading.Thread(target=host.unmount)
        stopping.start()
        stopping.join(0.3)
        assert stopping.is_alive() and not probe.stopped  # still serving the request
        probe.release.set()
        assert b"".join(chunks) == b"last"
        stopping.join(10)
    assert not stopping.is_alive() and probe.stopped


def test_what_an_app_left_running_is_cancelled_when_it_is_unmounted(host: AppHost) -> None:
    probe = Probe()
    host.mount(make_app("leaky", probe))
    assert httpx.get(f"{host.base}/spawn").text == "spawned"
    host.unmount()
    assert probe.stopped and probe.cancelled
    assert httpx.get(f"{host.base}/").status_code == 503  # nothing mounted
