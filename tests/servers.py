"""ASGI apps on loopback for tests: uvicorn in a background thread.

``ThreadedServer(app)`` serves one app for its lifetime (start, stop). ``AppHost`` is one
uvicorn that serves whichever app is mounted on it, so end-to-end tests get real HTTP on a
loopback socket without starting and stopping a server per test: ``mount(app)`` runs the
app's lifespan on the server's loop, ``unmount()`` closes the connections, waits for the
requests in flight and runs the lifespan's shutdown — what a server's graceful stop does.
``AppHosts`` lends hosts out for a session (a test with two replicas borrows two).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import uvicorn

Scope = MutableMapping[str, Any]


class ThreadedServer:
    def __init__(self, app: Any, port: int | None = None, *, lifespan: str = "on",
                 interface: str = "auto") -> None:
        # bound here, handed to uvicorn: no other process can take the port meanwhile
        self.socket = socket.socket()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", port or 0))
        self.port = int(self.socket.getsockname()[1])
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan=lifespan,
            access_log=False, interface=interface,  # type: ignore[arg-type]
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve(sockets=[self.socket]))
        self.loop.close()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def call(self, coro: Any, timeout: float = 10) -> Any:
        """Run a coroutine on the server's own loop (to reach its store or services)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@contextmanager
def serving(app: Any) -> Iterator[ThreadedServer]:
    server = ThreadedServer(app).start()
    try:
        yield server
    finally:
        server.stop()


class AppHost:
    """One uvicorn on a loopback port serving the mounted app (503 while none is)."""

    def __init__(self) -> None:
        self._app: Any = None
        self._state: dict[str, Any] = {}
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        self._lifespan: tuple[asyncio.Task[None], asyncio.Event] | None = None
        self._tasks_before: set[asyncio.Task[Any]] = set()
        self._server = ThreadedServer(self._serve, lifespan="off", interface="asgi3").start()

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base(self) -> str:
        return self._server.base

    @property
    def thread(self) -> threading.Thread:
        """The thread the server and the mounted app run on."""
        return self._server.thread

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def call(self, coro: Any, timeout: float = 10) -> Any:
        return self._server.call(coro, timeout)

    def mount(self, app: Any) -> None:
        """Start ``app``'s lifespan on this server's loop and serve it."""
        assert self._app is None, "an app is already mounted"
        self.call(self._start(app), timeout=30)

    def unmount(self, timeout: float = 15) -> None:
        """Close the connections, wait for requests in flight, shut the app's lifespan
        down, and cancel what the app left running on the loop."""
        self.call(self._stop(timeout), timeout=timeout + 15)

    def close(self) -> None:
        self._server.stop()

    async def _serve(self, scope: Scope, receive: Any, send: Any) -> None:
        app = self._app
        if app is None:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"no app mounted"})
            return
        if self._state:
            scope["state"] = dict(self._state)
        self._in_flight += 1
        assert self._idle is not None
        self._idle.clear()
        try:
            await app(scope, receive, send)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def _start(self, app: Any) -> None:
        self._tasks_before = asyncio.all_tasks()
        self._idle = asyncio.Event()
        self._idle.set()
        started: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()

        async def run() -> None:
            try:
                async with app.router.lifespan_context(app) as state:
                    started.set_result(dict(state or {}))
                    await stop.wait()
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                raise

        task = asyncio.create_task(run(), name="lifespan")
        self._lifespan = (task, stop)
        self._state = await started
        self._app = app

    async def _stop(self, grace: float) -> None:
        if self._lifespan is None:
            return
        # as a server's graceful stop: idle keep-alive connections close now, busy ones
        # after their response; the next test opens new ones
        for connection in list(self._server.server.server_state.connections):
            connection.shutdown()
        assert self._idle is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
        self._app = None
        task, stop = self._lifespan
        self._lifespan = None
        stop.set()
        try:
            await task
        finally:
            left = (asyncio.all_tasks() - self._tasks_before - {asyncio.current_task()}
                    - set(self._server.server.server_state.tasks))
            for leftover in left:
                leftover.cancel()
            await asyncio.gather(*left, return_exceptions=True)


class AppHosts:
    """A pool of ``AppHost``s for a test session: borrow one per proxy, give it back."""

    def __init__(self) -> None:
        self._free: list[AppHost] = []
        self._all: list[AppHost] = []

    def borrow(self, app: Any) -> AppHost:
        host = self._free.pop() if self._free else None
        if host is None or not host.alive:
            host = AppHost()
            self._all.append(host)
        host.mount(app)
        return host

    def give_back(self, host: AppHost) -> None:
        try:
            host.unmount()
        except BaseException:
            host.close()  # a host whose app did not stop cleanly serves no other test
            raise
        self._free.append(host)

    def close(self) -> None:
        for host in self._all:
            host.close()
        self._all.clear()
        self._free.clear()
