"""The Redis store: many proxy replicas sharing one Redis, a Redis Cluster or a
Sentinel-managed Redis, through redis-py.

Every key of a session shares the session's hash tag, ``mp:{ns:agent:session}:<part>``,
so one Lua script reads or writes the whole session atomically on one cluster slot. The
keys that span sessions live on other slots (other nodes of a cluster) and are written by
commands of their own, never inside a session's script:

    mp:agents                    zset agent -> last activity
    mp:agent:<agent>:sessions    zset [namespace, session] (JSON) -> last activity
    mp:ns:<namespace>:sessions   set [agent, session] (JSON): a client key's sessions
    mp:agentcfg:<agent>          the admin-saved agent definition (JSON)

A turn is one atomic write of its session; the indexes follow it (``storage/
redis_indexes.py`` repairs an index write that failed). The session parts are described in
``storage/lua/prelude.lua``; a session's media parts are the hash
``mp:{ns:agent:session}:media`` (digest -> media type, newline, bytes), read only under
that key and deleted with the session. (Versions before kept them in shared
``mp:part:<digest>`` keys, no longer read: a stored part is only ever sent in its own
turn.)
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Sequence
from typing import Any, cast

import orjson
from redis.exceptions import TimeoutError as RedisTimeoutError

from storage.base import StoreUnavailable
from storage.redact import mask_url
from storage.redis_calls import Command, RedisCalls
from storage.redis_client import SOCKET_TIMEOUT
from storage.redis_codec import (
    append_args,
    decode_array,
    decode_messages,
    decode_meta,
    decode_response,
)
from storage.redis_indexes import (
    AGENTS,
    IndexWrites,
    entries,
    namespace_key,
    namespace_member,
    session_member,
    sessions_key,
)
from storage.search import score, searchable_text
from strategies.records import (
    AgentInfo,
    AppendResult,
    LoadSpec,
    LogPage,
    RangeBudget,
    ResponseRef,
    SessionInfo,
    SessionKey,
    SessionMeta,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
)

__all__ = ["SOCKET_TIMEOUT", "RedisStore"]

SESSION_PARTS = (
    "meta", "msgs", "active", "users", "stubs", "tools", "summaries", "locks", "writes",
    "media", "responses",
)  # fmt: skip
# how long a write whose reply was lost is checked for, at most (a check that times out is
# asked again: Redis may be busy with other turns' large scripts)
LANDED_SECONDS = 6.0
# messages an append writes per second of its deadline beyond SOCKET_TIMEOUT (a turn that
# resends a history of 50,000 messages is given 5 s more)
APPEND_RATE = 10_000
# search_messages scans at most this many of a session's newest active messages
SEARCH_SCAN = 1000


class RedisStore:
    """Store backend on Redis. The URL says which deployment (``storage/redis_client.py``):

    - ``redis://host:port/db`` (``rediss://`` for TLS): one server;
    - ``redis+cluster://host:port`` (``rediss+cluster://``): a Redis Cluster, any node as
      the starting point;
    - ``redis+sentinel://host:port[,host:port...]/service/db``: the master that Sentinel
      names for ``service``.

    The calls go through ``storage/redis_calls.py``. On one server, ``load`` and
    ``append_turn`` are one round trip each (the script and its companion commands in one
    pipeline).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._calls = RedisCalls(url)
        self._indexes = IndexWrites(self._calls.send)

    async def open(self) -> None:
        # Nothing connects here, so a Redis that is down does not stop the proxy.
        await self._calls.open()

    async def close(self) -> None:
        await self._indexes.close()
        await self._calls.close()

    async def ping(self) -> bool:
        return await self._calls.ping()

    async def load(
        self,
        key: SessionKey,
        spec: LoadSpec,
        *,
        probe: Sequence[str] = (),
        held_version: int | None = None,
    ) -> SessionSnapshot:
        found, config = await self._calls.run(
            "load",
            _keys(key, "meta", "msgs", "active", "stubs", "summaries"),
            [spec.limit, spec.since, "" if held_version is None else held_version, *probe],
            (("GET", _agent_config_key(key.agent)),),
        )
        agent_config = orjson.loads(config) if config else None
        if len(found) == 1:
            return SessionSnapshot(SessionMeta(), [], [], agent_config=agent_config)
        meta, messages, stubs, summaries, matched, matched_seq, held = found
        return SessionSnapshot(
            meta=decode_meta(meta),
            messages=decode_array(messages, stubs),
            summaries=[SummaryRecord.from_dict(orjson.loads(raw)) for raw in summaries],
            matched=matched,
            matched_seq=matched_seq,
            agent_config=agent_config,
            exists=True,
            held=bool(held),
        )

    async def append_turn(self, key: SessionKey, write: TurnWrite) -> AppendResult:
        """The session's script, then the index entries (``storage/redis_indexes.py``).

        When the script's reply is lost (a timeout, a connection dropped after the write
        was sent), ``landed.lua`` asks whether it applied before anything is answered:
        it did (the turn is acknowledged), or it did not and now never will (its id is
        given up on, so the write still on its way is refused): ``StoreUnavailable``.
        """
        now = time.time()
        stamp = repr(now).encode()  # sent three times: formatted once
        keys = _keys(
            key, "meta", "msgs", "active", "users", "stubs", "tools", "writes", "responses"
        )
        index = entries(key, stamp)
        try:
            reply = await self._append(
                keys, append_args(write, now, stamp), index, len(write.messages)
            )
        except StoreUnavailable as lost:
            if not write.write_id:
                raise
            reply = await self._landed(key, write.write_id, lost)
            self._indexes.failed(index, lost)
        if reply[0] == 0:
            raise StoreUnavailable(mask_url(f"redis at {self.url}: the write was given up on"))
        first, superseded, meta = reply
        return AppendResult(
            seqs=list(range(first, first + len(write.messages))),
            superseded=superseded,
            meta=decode_meta(meta),
        )

    async def set_compressed(self, key: SessionKey, stubs: dict[int, str | None]) -> None:
        if not stubs:
            return
        args: list[Any] = []
        for seq, stub in stubs.items():
            args += (seq, stub or "")
        await self._calls.run("compress", _keys(key, "msgs", "stubs", "meta"), args)

    async def add_summary(
        self, key: SessionKey, summary: SummaryRecord, *, expect_boundary: int | None = None
    ) -> SummaryRecord | None:
        created_at = summary.created_at or time.time()
        body = summary.to_dict() | {"created_at": created_at}
        del body["id"]
        (summary_id,) = await self._calls.run(
            "summary",
            _keys(key, "meta", "summaries"),
            [
                "" if expect_boundary is None else expect_boundary,
                summary.kind,
                summary.to_seq,
                orjson.dumps(body),
            ],
        )
        if summary_id is None:
            return None
        return SummaryRecord.from_dict(body | {"id": summary_id})

    async def get_messages(self, key: SessionKey, seqs: Sequence[int]) -> list[StoredMessage]:
        if not seqs:
            return []
        msgs, stubs = _keys(key, "msgs", "stubs")
        messages, stub_values = await self._calls.commands(
            [("HMGET", msgs, *seqs), ("HMGET", stubs, *seqs)]
        )
        return decode_messages(messages, stub_values)

    async def get_range(
        self, key: SessionKey, from_seq: int, to_seq: int, *, budget: RangeBudget | None = None
    ) -> list[StoredMessage]:
        ((messages, stubs),) = await self._calls.run(
            "range", _keys(key, "active", "msgs", "stubs"), [from_seq, to_seq]
        )
        return decode_array(messages, stubs, budget)

    async def find_tool_result(self, key: SessionKey, tool_call_id: str) -> StoredMessage | None:
        (found,) = await self._calls.run(
            "tool_result", _keys(key, "tools", "active", "msgs", "stubs"), [tool_call_id]
        )
        if not found or found[0] is None:
            return None
        return decode_messages([found[0]], [found[1]])[0]

    async def find_response(self, key: SessionKey, response_id: str) -> ResponseRef | None:
        (found,) = await self._calls.commands([("HGET", _keys(key, "responses")[0], response_id)])
        return decode_response(response_id, found)

    async def forget_response(self, key: SessionKey, response_id: str) -> bool:
        (removed,) = await self._calls.commands(
            [("HDEL", _keys(key, "responses")[0], response_id)]
        )
        return bool(removed)

    async def read_log(self, key: SessionKey, *, after: int = 0, limit: int = 100) -> LogPage:
        # seqs run 1..head_seq without gaps (superseded messages keep theirs)
        last = max(0, after) + max(1, limit)
        seqs = list(range(max(0, after) + 1, last + 1))
        meta, msgs, active, stubs = _keys(key, "meta", "msgs", "active", "stubs")
        head, messages, stub_values, live = await self._calls.commands([
            ("HGET", meta, "head_seq"),
            ("HMGET", msgs, *seqs),
            ("HMGET", stubs, *seqs),
            ("ZRANGEBYSCORE", active, seqs[0], last, "WITHSCORES"),
        ])
        decoded = decode_messages(messages, stub_values)
        kept = {int(seq) for _, seq in _scored(live)}
        return LogPage(
            messages=decoded,
            superseded={m.seq for m in decoded if m.seq not in kept},
            next_after=last if decoded and last < int(head or 0) else None,
        )

    async def search_messages(
        self,
        key: SessionKey,
        words: Sequence[str],
        *,
        exclude: Sequence[int] = (),
        limit: int = 5,
    ) -> list[StoredMessage]:
        if not words or limit <= 0:
            return []
        (active,) = _keys(key, "active")
        (newest,) = await self._calls.commands(
            [("ZREVRANGEBYSCORE", active, "+inf", "-inf", "WITHSCORES", "LIMIT", 0, SEARCH_SCAN)]
        )
        skip = set(exclude)
        seqs = [int(seq) for _, seq in _scored(newest) if int(seq) not in skip]
        messages = await self.get_messages(key, seqs)
        # scoring a thousand messages' text is too long for the event loop
        return await asyncio.to_thread(_best, messages, words, limit)

    async def set_calibration(self, key: SessionKey, value: float) -> None:
        await self._calls.run("set_meta", _keys(key, "meta"), ["calibration", float(value)])

    async def list_agents(self) -> list[AgentInfo]:
        await self._indexes.flush()
        (reply,) = await self._calls.commands([("ZREVRANGE", AGENTS, 0, -1, "WITHSCORES")])
        agents = _scored(reply)
        counts = await self._calls.commands(
            [("ZCARD", sessions_key(agent.decode())) for agent, _ in agents]
        )
        # an agent whose sessions were all deleted is no longer listed (as in SQLite)
        return [
            AgentInfo(agent=agent.decode(), session_count=count, updated_at=updated_at)
            for (agent, updated_at), count in zip(agents, counts, strict=True)
            if count
        ]

    async def list_sessions(self, agent: str, *, limit: int = 200) -> list[SessionInfo]:
        if limit <= 0:
            return []
        await self._indexes.flush()
        (reply,) = await self._calls.commands(
            [("ZREVRANGE", sessions_key(agent), 0, limit - 1, "WITHSCORES")]
        )
        return await self._session_infos(agent, _scored(reply))

    async def find_sessions(self, agent: str, session: str) -> list[SessionInfo]:
        # the agent's index holds [namespace, session] members: ZSCAN matches the ones
        # that end with this session, however many the agent has
        await self._indexes.flush()
        pattern = b"*," + _glob_escape(orjson.dumps(session)) + b"]"
        async with self._calls.call():
            members = [
                (member, score)
                async for member, score in self._calls.redis.zscan_iter(
                    sessions_key(agent), match=pattern, count=1000
                )
                if _unpack_member(member, agent)[2] == session
            ]
        members.sort(key=lambda m: m[1], reverse=True)
        return await self._session_infos(agent, members)

    async def _session_infos(
        self, agent: str, members: list[tuple[bytes, float]]
    ) -> list[SessionInfo]:
        """Index members of ``agent`` and their scores as listed sessions (with their
        message counts, read in one round trip); members whose session is gone are left
        out, and dropped from the index."""
        keys = [SessionKey(*_unpack_member(member, agent)) for member, _ in members]
        counts = await self._calls.commands(
            [("HGET", _keys(session_key, "meta")[0], "active_count") for session_key in keys]
        )
        gone = [(member, score) for (member, score), count in zip(members, counts, strict=True)
                if count is None]
        if gone:
            # a delete raced a turn of the session: its entry outlived it
            await self._calls.run(
                "index_prune", (sessions_key(agent),), [v for pair in gone for v in pair]
            )
        return [
            SessionInfo(k.namespace, k.agent, k.session, int(count), updated_at)
            for k, (_, updated_at), count in zip(keys, members, counts, strict=True)
            if count is not None
        ]

    async def delete_session(self, key: SessionKey) -> bool:
        existed, *_ = await self._calls.run(
            "delete", _keys(key, *SESSION_PARTS), [],
            (("ZREM", sessions_key(key.agent), session_member(key)),
             ("SREM", namespace_key(key.namespace), namespace_member(key))),
        )
        return bool(existed)

    async def count_sessions(self, namespace: str) -> int:
        # the namespace's set is kept by append_turn and delete_session (sessions last
        # written before it existed are not in it until their next turn)
        await self._indexes.flush()
        (count,) = await self._calls.commands([("SCARD", namespace_key(namespace))])
        return int(count)

    async def get_agent_config(self, agent: str) -> dict[str, Any] | None:
        (raw,) = await self._calls.commands([("GET", _agent_config_key(agent))])
        return orjson.loads(raw) if raw else None

    async def set_agent_config(self, agent: str, config: dict[str, Any] | None) -> None:
        if config is None:
            await self._calls.commands([("DEL", _agent_config_key(agent))])
        else:
            await self._calls.commands([("SET", _agent_config_key(agent), orjson.dumps(config))])

    async def acquire_lock(self, key: SessionKey, name: str, ttl: float) -> str | None:
        token = uuid.uuid4().hex
        ttl_ms = max(1, int(ttl * 1000))
        (taken,) = await self._calls.run("lock_acquire", _keys(key, "locks"), [name, token, ttl_ms])
        return token if taken else None

    async def release_lock(self, key: SessionKey, name: str, token: str) -> None:
        await self._calls.run("lock_release", _keys(key, "locks"), [name, token])

    async def put_part(self, key: SessionKey, digest: str, data: bytes, media_type: str) -> None:
        await self.put_parts(key, [(digest, data, media_type)])

    async def get_part(self, key: SessionKey, digest: str) -> tuple[bytes, str] | None:
        return (await self.get_parts(key, [digest])).get(digest)

    async def put_parts(self, key: SessionKey, parts: Sequence[tuple[str, bytes, str]]) -> None:
        # content-addressed within the session: HSETNX, so a retry is harmless
        (media,) = _keys(key, "media")
        await self._calls.commands(
            [("HSETNX", media, digest, media_type.encode() + b"\n" + data)
             for digest, data, media_type in parts]
        )

    async def get_parts(
        self, key: SessionKey, digests: Sequence[str]
    ) -> dict[str, tuple[bytes, str]]:
        if not digests:
            return {}
        (values,) = await self._calls.commands([("HMGET", _keys(key, "media")[0], *digests)])
        found: dict[str, tuple[bytes, str]] = {}
        for digest, raw in zip(digests, values, strict=True):
            if raw is not None:
                media_type, _, data = raw.partition(b"\n")
                found[digest] = (data, media_type.decode())
        return found

    # --- the calls -----------------------------------------------------------------------

    async def _append(
        self, keys: Sequence[Any], args: Sequence[Any], index: list[Command], count: int
    ) -> list[Any]:
        """The append script, then the index commands (and any still pending): in one
        pipeline behind it on one server; after its reply on a cluster (their nodes are
        others). The deadline grows with the ``count`` messages written: Redis takes about
        a second for each ``APPEND_RATE`` of them."""
        index = self._indexes.with_pending(index)
        if self._calls.cluster:
            reply = await self._calls.script("append", keys, args)
            try:
                self._indexes.settle(index, await self._calls.send(index))
            except StoreUnavailable as exc:
                self._indexes.failed(index, exc)
            return cast("list[Any]", reply)
        base = self._calls.deadline
        deadline = None if base is None else base + count / APPEND_RATE
        reply, replies = await self._calls.run_with("append", keys, args, index, deadline)
        self._indexes.settle(index, replies)
        return cast("list[Any]", reply)

    async def _landed(self, key: SessionKey, write_id: str, lost: StoreUnavailable) -> list[Any]:
        """``[first seq, 0, meta]`` of a write that applied; raises when it did not.

        A Redis that answers nothing in time may be busy rather than gone (running large
        scripts queued before this one): the check is asked again, for up to
        ``LANDED_SECONDS`` in all. A Redis that cannot be reached ends it at once."""
        deadline = time.monotonic() + LANDED_SECONDS
        while True:
            try:
                reply = await self._calls.script("landed", _keys(key, "writes", "meta"), [write_id])
                break
            except StoreUnavailable as exc:
                timed_out = isinstance(exc.__cause__, (TimeoutError, RedisTimeoutError))
                if not timed_out or time.monotonic() >= deadline:
                    raise lost from None
        if reply[0] == 0:
            raise lost
        return [reply[0], 0, reply[1]]


@functools.lru_cache(maxsize=4096)
def _keys(key: SessionKey, *parts: str) -> tuple[str, ...]:
    prefix = f"mp:{key.tag}:"
    return tuple(prefix + part for part in parts)


def _agent_config_key(agent: str) -> str:
    return f"mp:agentcfg:{agent}"


def _scored(reply: Any) -> list[tuple[bytes, float]]:
    """A WITHSCORES reply, typed."""
    return cast("list[tuple[bytes, float]]", reply)


def _glob_escape(text: bytes) -> bytes:
    """``text`` as a literal in a Redis glob pattern."""
    for special in (b"\\", b"*", b"?", b"[", b"]"):
        text = text.replace(special, b"\\" + special)
    return text


def _unpack_member(member: bytes, agent: str) -> tuple[str, str, str]:
    namespace, session = orjson.loads(member)
    return namespace, agent, session


def _best(
    messages: Sequence[StoredMessage], words: Sequence[str], limit: int
) -> list[StoredMessage]:
    scored = [(score(searchable_text(m), words), m) for m in messages]
    ranked = sorted((p for p in scored if p[0] > 0), key=lambda p: (-p[0], -p[1].seq))
    return [m for _, m in ranked[:limit]]
