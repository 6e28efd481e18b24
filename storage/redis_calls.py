"""The Redis store's calls: the client a URL names, its scripts, and the one seam where a
Redis that cannot serve becomes ``StoreUnavailable``.

A call is one pipeline (one round trip) on one server; on a cluster, each command goes to
its slot's node, all at once. Scripts run by ``EVALSHA`` (redis-py's ``register_script``:
loaded again after a restart, a failover or ``SCRIPT FLUSH``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError, ResponseError

from storage.base import StoreUnavailable
from storage.redact import mask_url
from storage.redis_client import UNAVAILABLE, call_timeout, connect, disconnect

__all__ = ["Command", "RedisCalls", "source"]

SCRIPTS = (
    "load", "append", "landed", "range", "tool_result", "compress", "summary", "set_meta",
    "delete", "lock_acquire", "lock_release", "index_prune",
)  # fmt: skip
Command = tuple[Any, ...]
# uvloop's error for an operation on a closed transport ("unable to perform operation on
# <TCPTransport closed=True ...>; the handler is closed")
CLOSED_TRANSPORT = "the handler is closed"


def source(name: str) -> str:
    """A script's text: the shared prelude, then the script (``storage/lua/``)."""
    folder = Path(__file__).with_name("lua")
    return (folder / "prelude.lua").read_text() + (folder / f"{name}.lua").read_text()


class RedisCalls:
    """The client of one store URL and the calls the store makes through it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: Redis | RedisCluster | None = None
        self._scripts: dict[str, AsyncScript] = {}
        self._map_lock = asyncio.Lock()
        self.deadline: float | None = None

    @property
    def cluster(self) -> bool:
        return isinstance(self._client, RedisCluster)

    async def open(self) -> None:
        """Make the client; nothing connects yet."""
        self._client = connect(self.url)
        self.deadline = call_timeout(self._client)
        self._scripts = {name: self._client.register_script(source(name)) for name in SCRIPTS}

    async def close(self) -> None:
        if self._client is not None:
            await disconnect(self._client)
            self._client = None

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except (RedisError, OSError):
            return False

    @property
    def redis(self) -> Redis | RedisCluster:
        if self._client is None:
            raise RuntimeError("RedisStore used before open()")
        return self._client

    @asynccontextmanager
    async def call(self, deadline: float | None = None) -> AsyncIterator[None]:
        """The one seam where Redis being unavailable becomes ``StoreUnavailable``, under
        the call's deadline (``storage/redis_client.py``; ``deadline`` for a longer one)."""
        seconds = deadline or self.deadline
        try:
            async with asyncio.timeout(seconds):
                yield
        except TimeoutError as exc:  # the deadline (redis-py's own is in UNAVAILABLE)
            raise StoreUnavailable(
                mask_url(f"redis at {self.url} is unavailable: no reply within {seconds:.1f} s")
            ) from exc
        except UNAVAILABLE as exc:
            reason = str(exc) or type(exc).__name__
            raise StoreUnavailable(
                mask_url(f"redis at {self.url} is unavailable: {reason}")
            ) from exc
        except RuntimeError as exc:
            if CLOSED_TRANSPORT not in str(exc):
                raise
            # uvloop refuses a write on a connection closed under the call (asyncio's loop
            # drops it silently): a failover closing connections in use, as below. Nothing
            # was sent on it
            raise StoreUnavailable(
                mask_url(f"redis at {self.url} is unavailable: a connection closed while in use")
            ) from exc
        except AttributeError as exc:
            if not self.cluster:
                raise
            # redis-py 8.1's cluster client, reading the slot map again (a failover) while
            # other calls are under way, can close a connection one of them is making
            # (see slot_map): that call failed to reach Redis
            raise StoreUnavailable(
                mask_url(f"redis at {self.url} is unavailable: a connection closed while in use")
            ) from exc

    async def send(
        self, commands: Sequence[Command], deadline: float | None = None
    ) -> list[Any]:
        """Each command's reply, an error reply in its place. One pipeline (one round
        trip) on one server; on a cluster, each command on its slot's node, all at once
        (each its own redis-py call, which follows the cluster's changes). A connection
        lost or refused raises ``StoreUnavailable``."""
        if not commands:
            return []
        client = self.redis
        async with self.call(deadline):
            if isinstance(client, RedisCluster):
                await self.slot_map(client)
                replies = await asyncio.gather(
                    *(client.execute_command(*command) for command in commands),
                    return_exceptions=True,
                )
            else:
                pipe = client.pipeline(transaction=False)
                for command in commands:
                    pipe.execute_command(*command)
                replies = await pipe.execute(raise_on_error=False)
            for reply in replies:
                # an error reply takes its command's place, unless it says that Redis
                # cannot serve now (CLUSTERDOWN, TRYAGAIN, READONLY, LOADING: some are
                # error replies), which is raised here, at the seam
                if isinstance(reply, UNAVAILABLE) or (
                        isinstance(reply, BaseException) and not isinstance(reply, ResponseError)):
                    raise reply
            return cast("list[Any]", list(replies))

    async def slot_map(self, client: RedisCluster) -> None:
        """Read the cluster's slot map first (again after a failure), alone.

        redis-py 8.1 reads it lazily inside the first command that finds it missing; other
        commands started meanwhile may then find their new connection closed under them
        (``AttributeError``). So every call here waits for the map before it starts.
        """
        if client._initialize:  # set by redis-py after a connection error, too
            async with self._map_lock:
                await client.initialize()

    async def commands(self, commands: Sequence[Command]) -> list[Any]:
        """Each command's reply; an error reply raised."""
        replies = await self.send(commands)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies

    async def script(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """``EVALSHA`` of the script, loaded first when the server does not have it."""
        async with self.call():
            if isinstance(self._client, RedisCluster):
                await self.slot_map(self._client)
            return await self._scripts[name](keys, args)

    async def run(
        self, name: str, keys: Sequence[Any], args: Sequence[Any],
        extra: Sequence[Command] = (),
    ) -> list[Any]:
        """The script's reply, then the replies of the ``extra`` commands (on any slot),
        sent with it; an error reply raised."""
        reply, replies = await self.run_with(name, keys, args, extra)
        for other in replies:
            if isinstance(other, BaseException):
                raise other
        return [reply, *replies]

    async def run_with(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], extra: Sequence[Command],
        deadline: float | None = None,
    ) -> tuple[Any, list[Any]]:
        """The script's reply (an error reply raised) and those of the ``extra`` commands
        (an error reply in its place)."""
        script = self._scripts[name]
        reply, *replies = await self.send(
            [("EVALSHA", script.sha, len(keys), *keys, *args), *extra], deadline
        )
        if isinstance(reply, NoScriptError):
            # the script cache is empty (first call, restart, failover, SCRIPT FLUSH)
            reply = await self.script(name, keys, args)
        if isinstance(reply, BaseException):
            raise reply
        return reply, replies
