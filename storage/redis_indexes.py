"""The Redis store's cross-session indexes, and their repair.

    mp:agents                    zset agent -> last activity
    mp:agent:<agent>:sessions    zset [namespace, session] (JSON) -> last activity
    mp:ns:<namespace>:sessions   set [agent, session] (JSON): a client key's sessions

They live on other slots than the sessions they list (other nodes of a cluster), so a turn
writes them with commands of their own after its session's script: the turn stays one
atomic write of its session, and the index can miss it (its node failing over, a lost
connection). Such a miss is never left in place:

- the failed index commands are kept in this process and sent again every second, and
  before any listing here, until they apply (``ZADD GT``: a late one never moves an entry
  back in time); the next turn of the session writes its entries anew anyway;
- a listing drops an entry whose session is gone (a delete that raced a turn), unless the
  entry moved meanwhile (``index_prune.lua``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from strategies.records import SessionKey

__all__ = [
    "AGENTS", "IndexWrites", "entries", "namespace_key", "namespace_member", "session_member",
    "sessions_key",
]

AGENTS = "mp:agents"
RETRY_SECONDS = 1.0
# index entries waiting for a retry, at most (the oldest are dropped past it: the
# sessions' next turns write them again)
MAX_PENDING = 100_000

log = logging.getLogger("memory_proxy.store")
Command = tuple[Any, ...]
Send = Callable[[Sequence[Command]], Awaitable[list[Any]]]


def sessions_key(agent: str) -> str:
    return f"mp:agent:{agent}:sessions"


def session_member(key: SessionKey) -> bytes:
    return orjson.dumps([key.namespace, key.session])


def namespace_key(namespace: str) -> str:
    return f"mp:ns:{namespace}:sessions"


def namespace_member(key: SessionKey) -> bytes:
    return orjson.dumps([key.agent, key.session])


def entries(key: SessionKey, stamp: bytes) -> list[Command]:
    """The index writes of one turn of ``key`` at time ``stamp``."""
    return [
        ("ZADD", AGENTS, "GT", stamp, key.agent),
        ("ZADD", sessions_key(key.agent), "GT", stamp, session_member(key)),
        ("SADD", namespace_key(key.namespace), namespace_member(key)),
    ]


class IndexWrites:
    """Index commands that failed, kept and sent again until they apply."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._pending: dict[tuple[Any, Any], Command] = {}
        self._retry: asyncio.Task[None] | None = None

    def with_pending(self, commands: list[Command]) -> list[Command]:
        """``commands`` and every pending one (sent together, they cost no round trip)."""
        if not self._pending:
            return commands
        return [*self._pending.values(), *commands]

    def settle(self, commands: Sequence[Command], replies: Sequence[Any]) -> None:
        """Keep the commands whose reply is an error; forget those that applied."""
        for command, reply in zip(commands, replies, strict=True):
            slot = (command[1], command[-1])  # the key and the member
            kept = self._pending.get(slot)
            if isinstance(reply, BaseException):
                if kept is None or _not_older(command, kept):
                    self._pending[slot] = command
            elif kept is not None and _not_older(command, kept):
                del self._pending[slot]
        while len(self._pending) > MAX_PENDING:
            del self._pending[next(iter(self._pending))]
        if self._pending and (self._retry is None or self._retry.done()):
            log.warning("index writes failed; %d kept for a retry", len(self._pending))
            self._retry = asyncio.get_running_loop().create_task(self._retry_loop())

    def failed(self, commands: Sequence[Command], error: BaseException) -> None:
        self.settle(commands, [error] * len(commands))

    async def flush(self) -> None:
        """Send the pending commands now (before a listing)."""
        if not self._pending:
            return
        commands = list(self._pending.values())
        try:
            replies = await self._send(commands)
        except Exception as exc:  # still unavailable: kept for the next try
            self.failed(commands, exc)
            return
        self.settle(commands, replies)

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
            self._retry = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), 2)

    async def _retry_loop(self) -> None:
        while self._pending:
            await asyncio.sleep(RETRY_SECONDS)
            await self.flush()


def _not_older(command: Command, than: Command) -> bool:
    """``command`` writes its entry as late as ``than`` (a ZADD's score is its time)."""
    return command[0] != "ZADD" or float(command[3]) >= float(than[3])
