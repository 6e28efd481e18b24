"""Script calls of the Redis store: pre-packed commands, one write, the replies read back.

redis-py's ``Pipeline`` spends more CPU on a turn's two store calls than the calls
themselves: it packs every argument through its encoder, takes the pool's lock, records
connection statistics on every checkout and runs each write in a task of its own under
``asyncio.wait_for``. A script call needs none of it: a few commands written at once on a
connection nobody else is using, then exactly as many replies read. ``ScriptWire`` keeps
idle connections of its own, made and handshaken by the client's pool (AUTH, SELECT, TLS:
whatever the URL says), and puts one deadline around each whole call.

Never retried: a command whose reply was lost may still have run (a retried append would
store its turn twice). A connection that failed, timed out or was cancelled in the middle
of a call is closed, never reused out of step with its replies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Arg", "Command", "ScriptWire", "bulk", "pack"]

Arg = bytes | str | int | float
Command = Sequence[Arg]
# idle connections kept beyond this many (after a burst of concurrent calls) are closed
MAX_IDLE = 64


def bulk(args: Iterable[Arg]) -> bytes:
    """``args`` as the protocol's bulk strings (numbers written as redis-py writes them),
    without the ``*<count>`` header that starts a command."""
    out: list[bytes] = []
    add = out.append
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, float):
            data = repr(arg).encode()
        elif isinstance(arg, int) and not isinstance(arg, bool):  # redis-py refuses a bool
            data = b"%d" % arg
        else:
            raise TypeError(f"cannot send a {type(arg).__name__} to Redis")
        size = len(data)
        add(_BULK_HEADERS[size] if size < len(_BULK_HEADERS) else b"$%d\r\n" % size)
        add(data)
        add(b"\r\n")
    return b"".join(out)


# formatting every length took half the time of packing a turn's arguments
_BULK_HEADERS = tuple(b"$%d\r\n" % size for size in range(4096))


def pack(commands: Iterable[Command]) -> bytes:
    """``commands`` in the protocol, as one buffer."""
    return b"".join([b"*%d\r\n%b" % (len(command), bulk(command)) for command in commands])


class ScriptWire:
    """One round trip per call, on connections taken from no one else."""

    def __init__(self, pool: ConnectionPool, timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout
        self._idle: list[AbstractConnection] = []
        self._closed = False

    async def call(self, packed: bytes, count: int) -> list[Any]:
        """Send ``packed`` (``count`` commands) and read their ``count`` replies. An error
        reply (``ResponseError``) takes its command's place in the list; a lost or broken
        connection raises redis-py's ``ConnectionError`` or ``TimeoutError``."""
        connection = await self._take()
        try:
            async with asyncio.timeout(self._timeout):
                await connection.send_packed_command(packed, check_health=False)
                replies: list[Any] = []
                for _ in range(count):
                    try:
                        replies.append(await connection.read_response(disable_decoding=True))
                    except ResponseError as exc:
                        replies.append(exc)
        except BaseException as exc:
            await connection.disconnect(nowait=True)
            if isinstance(exc, TimeoutError):
                raise RedisTimeoutError(f"no reply from Redis within {self._timeout} s") from None
            raise
        if self._closed or len(self._idle) >= MAX_IDLE:
            await connection.disconnect()
        else:
            self._idle.append(connection)
        return replies

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.disconnect()

    async def _take(self) -> AbstractConnection:
        """An idle connection still open, or a new one. Nothing is sent on it yet, so a
        connection the server closed while it was idle is simply replaced."""
        while self._idle:
            connection = self._idle.pop()
            if connection.is_connected and not await _has_pending(connection):
                return connection
            await connection.disconnect(nowait=True)
        if self._closed:
            raise RedisConnectionError("the Redis store is closed")
        connection = self._pool.make_connection()
        try:
            await connection.connect()
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        # every call of this wire runs under its own deadline (the handshake above used
        # the pool's): without a socket timeout redis-py writes without wait_for's task
        connection.socket_timeout = None
        return connection


async def _has_pending(connection: AbstractConnection) -> bool:
    """Data or the end of the stream waits on an idle connection: the server closed it
    (a restart) or it is out of step. Either way it must not carry a call."""
    # can_read() since redis-py 8, can_read_destructive() before
    check = getattr(connection, "can_read", None) or connection.can_read_destructive
    try:
        return bool(await check())
    except RedisConnectionError:
        return True
