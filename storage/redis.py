"""The Redis store: many proxy replicas sharing one Redis (or a Redis Cluster).

Every key of a session shares the session's hash tag, ``mp:{ns:agent:session}:<part>``,
so one Lua script can read or write the whole session atomically on one cluster slot.
The indexes that span sessions live outside that slot and ride in the same write:

    mp:agents                    zset agent -> last activity
    mp:agent:<agent>:sessions    zset [namespace, session] (JSON) -> last activity
    mp:agentcfg:<agent>          the admin-saved agent definition (JSON)

The session parts are described in ``storage/lua/prelude.lua``; a session's media parts
are the hash ``mp:{ns:agent:session}:media`` (digest -> media type, newline, bytes), read
only under that key and deleted with the session. (Versions before kept them in shared
``mp:part:<digest>`` keys, no longer read: a stored part is only ever sent in its own
turn.)
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from storage.base import StoreUnavailable
from storage.codec import message_from_body
from storage.redact import mask_url
from storage.redis_wire import Command, ScriptWire, bulk, pack
from storage.search import score, searchable_text
from strategies.records import (
    AgentInfo,
    AppendResult,
    LoadSpec,
    LogPage,
    SessionInfo,
    SessionKey,
    SessionMeta,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
)

# A stalled Redis must fail a request fast instead of hanging it.
SOCKET_TIMEOUT = 1.5
AGENTS = "mp:agents"
# search_messages scans at most this many of a session's newest active messages
SEARCH_SCAN = 1000
SESSION_PARTS = (
    "meta", "msgs", "active", "users", "stubs", "tools", "summaries", "locks", "media"
)


@dataclass(frozen=True, slots=True)
class _Script:
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> _Script:
        folder = Path(__file__).with_name("lua")
        source = (folder / "prelude.lua").read_text() + (folder / f"{name}.lua").read_text()
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


LOAD = _Script.load("load")
APPEND = _Script.load("append")
RANGE = _Script.load("range")
TOOL_RESULT = _Script.load("tool_result")
COMPRESS = _Script.load("compress")
SUMMARY = _Script.load("summary")
SET_META = _Script.load("set_meta")
DELETE = _Script.load("delete")
LOCK_ACQUIRE = _Script.load("lock_acquire")
LOCK_RELEASE = _Script.load("lock_release")


class RedisStore:
    """Store backend on Redis: ``redis://host:port/db`` (``rediss://`` for TLS).

    ``load`` and ``append_turn`` are one Lua script each, written at once with the
    commands on the cross-session indexes: one network round trip per call (see
    ``storage/redis_wire.py``).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: Redis | None = None
        self._wire: ScriptWire | None = None

    async def open(self) -> None:
        # No retries: a retried append whose reply was lost would store the turn twice.
        # Nothing connects here, so a Redis that is down does not stop the proxy.
        self._client = Redis.from_url(
            self.url,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=SOCKET_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
        )
        self._wire = ScriptWire(self._client.connection_pool, SOCKET_TIMEOUT)

    async def close(self) -> None:
        if self._wire is not None:
            await self._wire.close()
            self._wire = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    async def load(
        self,
        key: SessionKey,
        spec: LoadSpec,
        *,
        probe: Sequence[str] = (),
        known_version: int | None = None,
        known_head: int | None = None,
    ) -> SessionSnapshot:
        known = "" if known_version is None else known_version
        head = "" if known_version is None or known_head is None else known_head
        found, config = await self._run(
            LOAD,
            _keys(key, "meta", "msgs", "active", "stubs", "summaries"),
            [spec.limit, spec.since, known, head, *probe],
            ((b"GET", _agent_config_key(key.agent)),),
        )
        agent_config = orjson.loads(config) if config else None
        if len(found) == 1:
            return SessionSnapshot(SessionMeta(), [], [], agent_config=agent_config)
        meta, messages, stubs, summaries, matched, matched_seq, unchanged, grown = found
        return SessionSnapshot(
            meta=_decode_meta(meta),
            messages=_decode_array(messages, stubs),
            summaries=[SummaryRecord.from_dict(orjson.loads(raw)) for raw in summaries],
            matched=matched,
            matched_seq=matched_seq,
            agent_config=agent_config,
            exists=True,
            unchanged=bool(unchanged),
            grown=bool(grown),
        )

    async def append_turn(
        self, key: SessionKey, write: TurnWrite, *, with_others: bool = False
    ) -> AppendResult:
        now = time.time()
        stamp = repr(now).encode()  # sent three times: formatted once
        fields: list[Any] = []
        for name, value in _meta_updates(write):
            fields += (name, value)
        args: list[Any] = [
            stamp,
            len(write.messages),
            "" if write.supersede_after is None else write.supersede_after,
            "" if write.supersede_until is None else write.supersede_until,
            len(fields) // 2,
            *fields,
        ]
        for message in write.messages:
            args += (
                message.fingerprint,
                message.role,
                message.tool_call_id if message.role == "tool" and message.tool_call_id else "",
                message.compressed_content or "",
                _encode_message(message, now),
            )
        stubs = write.compressed or {}
        args.append(len(stubs))
        for seq, stub in stubs.items():
            args += (seq, stub or "")
        indexes = (
            (b"ZADD", AGENTS, stamp, key.agent),
            (b"ZADD", _sessions_key(key.agent), stamp, orjson.dumps([key.namespace, key.session])),
            (b"SADD", _namespace_key(key.namespace), orjson.dumps([key.agent, key.session])),
        )
        (first, superseded, meta), *_ = await self._run(
            APPEND, _keys(key, "meta", "msgs", "active", "users", "stubs", "tools"), args, indexes
        )
        return AppendResult(
            seqs=list(range(first, first + len(write.messages))),
            superseded=superseded,
            meta=_decode_meta(meta),
        )

    async def set_compressed(self, key: SessionKey, stubs: dict[int, str | None]) -> None:
        if not stubs:
            return
        args: list[Any] = []
        for seq, stub in stubs.items():
            args += (seq, stub or "")
        await self._run(COMPRESS, _keys(key, "msgs", "stubs", "meta"), args)

    async def add_summary(
        self, key: SessionKey, summary: SummaryRecord, *, expect_boundary: int | None = None
    ) -> SummaryRecord | None:
        created_at = summary.created_at or time.time()
        body = summary.to_dict() | {"created_at": created_at}
        del body["id"]
        (summary_id,) = await self._run(
            SUMMARY,
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
        with self._errors():
            pipe = self._redis.pipeline(transaction=True)
            pipe.hmget(msgs, list(seqs))
            pipe.hmget(stubs, list(seqs))
            messages, stub_values = await pipe.execute()
        return _decode_messages(messages, stub_values)

    async def get_range(self, key: SessionKey, from_seq: int, to_seq: int) -> list[StoredMessage]:
        ((messages, stubs),) = await self._run(
            RANGE, _keys(key, "active", "msgs", "stubs"), [from_seq, to_seq]
        )
        return _decode_array(messages, stubs)

    async def find_tool_result(self, key: SessionKey, tool_call_id: str) -> StoredMessage | None:
        (found,) = await self._run(
            TOOL_RESULT, _keys(key, "tools", "active", "msgs", "stubs"), [tool_call_id]
        )
        if not found or found[0] is None:
            return None
        return _decode_messages([found[0]], [found[1]])[0]

    async def read_log(self, key: SessionKey, *, after: int = 0, limit: int = 100) -> LogPage:
        # seqs run 1..head_seq without gaps (superseded messages keep theirs)
        last = max(0, after) + max(1, limit)
        seqs = list(range(max(0, after) + 1, last + 1))
        meta, msgs, active, stubs = _keys(key, "meta", "msgs", "active", "stubs")
        with self._errors():
            pipe = self._redis.pipeline(transaction=True)
            pipe.hget(meta, "head_seq")
            pipe.hmget(msgs, seqs)
            pipe.hmget(stubs, seqs)
            pipe.zrangebyscore(active, seqs[0], last, withscores=True)
            head, messages, stub_values, live = await pipe.execute()
        decoded = _decode_messages(messages, stub_values)
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
        with self._errors():
            newest = await self._redis.zrevrangebyscore(
                active, "+inf", "-inf", start=0, num=SEARCH_SCAN, withscores=True
            )
        skip = set(exclude)
        seqs = [int(seq) for _, seq in _scored(newest) if int(seq) not in skip]
        messages = await self.get_messages(key, seqs)
        # scoring a thousand messages' text is too long for the event loop
        return await asyncio.to_thread(_best, messages, words, limit)

    async def set_calibration(self, key: SessionKey, value: float) -> None:
        await self._run(SET_META, _keys(key, "meta"), ["calibration", float(value)])

    async def list_agents(self) -> list[AgentInfo]:
        with self._errors():
            agents = _scored(await self._redis.zrevrange(AGENTS, 0, -1, withscores=True))
            pipe = self._redis.pipeline(transaction=False)
            for agent, _ in agents:
                pipe.zcard(_sessions_key(agent.decode()))
            counts = await pipe.execute()
        # an agent whose sessions were all deleted is no longer listed (as in SQLite)
        return [
            AgentInfo(agent=agent.decode(), session_count=count, updated_at=updated_at)
            for (agent, updated_at), count in zip(agents, counts, strict=True)
            if count
        ]

    async def list_sessions(self, agent: str, *, limit: int = 200) -> list[SessionInfo]:
        if limit <= 0:
            return []
        with self._errors():
            members = _scored(
                await self._redis.zrevrange(_sessions_key(agent), 0, limit - 1, withscores=True)
            )
            return await self._session_infos(agent, members)

    async def find_sessions(self, agent: str, session: str) -> list[SessionInfo]:
        # the agent's index holds [namespace, session] members: ZSCAN matches the ones
        # that end with this session, however many the agent has
        pattern = b"*," + _glob_escape(orjson.dumps(session)) + b"]"
        with self._errors():
            members = [
                (member, score)
                async for member, score in self._redis.zscan_iter(
                    _sessions_key(agent), match=pattern, count=1000
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
        out."""
        keys = [SessionKey(*_unpack_member(member, agent)) for member, _ in members]
        pipe = self._redis.pipeline(transaction=False)
        for session_key in keys:
            pipe.hget(_keys(session_key, "meta")[0], "active_count")
        counts = await pipe.execute()
        return [
            SessionInfo(k.namespace, k.agent, k.session, int(count), updated_at)
            for k, (_, updated_at), count in zip(keys, members, counts, strict=True)
            if count is not None
        ]

    async def delete_session(self, key: SessionKey) -> bool:
        member = orjson.dumps([key.namespace, key.session])
        existed, *_ = await self._run(
            DELETE,
            _keys(key, *SESSION_PARTS),
            [],
            (
                (b"ZREM", _sessions_key(key.agent), member),
                (b"SREM", _namespace_key(key.namespace), orjson.dumps([key.agent, key.session])),
            ),
        )
        return bool(existed)

    async def count_sessions(self, namespace: str) -> int:
        # the namespace's set is kept by append_turn and delete_session (sessions last
        # written before it existed are not in it until their next turn)
        with self._errors():
            return int(await self._redis.scard(_namespace_key(namespace)))

    async def get_agent_config(self, agent: str) -> dict[str, Any] | None:
        with self._errors():
            raw = await self._redis.get(_agent_config_key(agent))
        return orjson.loads(raw) if raw else None

    async def set_agent_config(self, agent: str, config: dict[str, Any] | None) -> None:
        with self._errors():
            if config is None:
                await self._redis.delete(_agent_config_key(agent))
            else:
                await self._redis.set(_agent_config_key(agent), orjson.dumps(config))

    async def acquire_lock(self, key: SessionKey, name: str, ttl: float) -> str | None:
        token = uuid.uuid4().hex
        ttl_ms = max(1, int(ttl * 1000))
        (taken,) = await self._run(LOCK_ACQUIRE, _keys(key, "locks"), [name, token, ttl_ms])
        return token if taken else None

    async def release_lock(self, key: SessionKey, name: str, token: str) -> None:
        await self._run(LOCK_RELEASE, _keys(key, "locks"), [name, token])

    async def put_part(self, key: SessionKey, digest: str, data: bytes, media_type: str) -> None:
        await self.put_parts(key, [(digest, data, media_type)])

    async def get_part(self, key: SessionKey, digest: str) -> tuple[bytes, str] | None:
        return (await self.get_parts(key, [digest])).get(digest)

    async def put_parts(self, key: SessionKey, parts: Sequence[tuple[str, bytes, str]]) -> None:
        if not parts:
            return
        # content-addressed within the session: HSETNX, so a retry is harmless
        (media,) = _keys(key, "media")
        with self._errors():
            async with self._redis.pipeline(transaction=False) as pipe:
                for digest, data, media_type in parts:
                    pipe.hsetnx(media, digest, media_type.encode() + b"\n" + data)
                await pipe.execute()

    async def get_parts(
        self, key: SessionKey, digests: Sequence[str]
    ) -> dict[str, tuple[bytes, str]]:
        if not digests:
            return {}
        with self._errors():
            values = cast(
                "list[bytes | None]",
                await self._redis.hmget(_keys(key, "media")[0], list(digests)),
            )
        found: dict[str, tuple[bytes, str]] = {}
        for digest, raw in zip(digests, values, strict=True):
            if raw is not None:
                media_type, _, data = raw.partition(b"\n")
                found[digest] = (data, media_type.decode())
        return found

    @property
    def _redis(self) -> Redis:
        if self._client is None:
            raise RuntimeError("RedisStore used before open()")
        return self._client

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """The one seam where redis connection failures become ``StoreUnavailable``."""
        try:
            yield
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise StoreUnavailable(
                mask_url(f"redis at {self.url} is unavailable: {exc}")
            ) from exc

    async def _run(
        self,
        script: _Script,
        keys: tuple[str, ...],
        args: Sequence[Any],
        extra: Sequence[Command] = (),
    ) -> list[Any]:
        """EVALSHA ``script`` plus the ``extra`` commands in one write: one round trip.

        Not redis-py's ``register_script``: in a pipeline it first asks SCRIPT EXISTS,
        a second round trip on every call.
        """
        if self._wire is None:
            raise RuntimeError("RedisStore used before open()")
        packed = b"*%d\r\n%b%b%b" % (
            3 + len(keys) + len(args),
            _evalsha_head(script.sha, keys),
            bulk(args),
            pack(extra),
        )
        with self._errors():
            replies = await self._wire.call(packed, 1 + len(extra))
            if isinstance(replies[0], NoScriptError):
                # the script cache is empty (first call, restart, SCRIPT FLUSH); EVAL fills it
                (replies[0],) = await self._wire.call(
                    pack(((b"EVAL", script.source, len(keys), *keys, *args),)), 1
                )
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies


@functools.lru_cache(maxsize=4096)
def _keys(key: SessionKey, *parts: str) -> tuple[str, ...]:
    prefix = f"mp:{key.tag}:"
    return tuple(prefix + part for part in parts)


@functools.lru_cache(maxsize=4096)
def _evalsha_head(sha: str, keys: tuple[str, ...]) -> bytes:
    """The packed start of ``EVALSHA sha len(keys) *keys``: the same every turn of a session."""
    return bulk((b"EVALSHA", sha, len(keys), *keys))


def _sessions_key(agent: str) -> str:
    return f"mp:agent:{agent}:sessions"


def _namespace_key(namespace: str) -> str:
    return f"mp:ns:{namespace}:sessions"


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


def _meta_updates(write: TurnWrite) -> Iterator[tuple[str, Any]]:
    if write.system_prompt is not None:
        yield "system_prompt", orjson.dumps(write.system_prompt)
    if write.system_tokens is not None:
        yield "system_tokens", write.system_tokens
    if write.model is not None:
        yield "model", write.model
    if write.calibration is not None:
        yield "calibration", float(write.calibration)


def _encode_message(message: StoredMessage, now: float) -> bytes:
    """The message JSON without seq and chain (the script prepends them)."""
    body: dict[str, Any] = {
        "role": message.role,
        "content": message.content,
        "tokens": message.tokens,
        "fingerprint": message.fingerprint,
        "created_at": message.created_at or now,
    }
    if message.tool_calls is not None:
        body["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        body["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        body["name"] = message.name
    if message.meta:
        body["meta"] = message.meta
    return orjson.dumps(body)


def _decode_array(array: bytes, stubs: Sequence[bytes]) -> list[StoredMessage]:
    """Messages from a script's JSON array and its flat ``[seq, stub, ...]`` list."""
    by_seq = {int(seq): stub.decode() for seq, stub in zip(stubs[::2], stubs[1::2], strict=True)}
    stub = by_seq.get
    return [
        message_from_body(data, data["seq"], data.get("chain", ""), stub(data["seq"]))
        for data in orjson.loads(array)
    ]


def _decode_messages(
    messages: Sequence[bytes | None], stubs: Sequence[bytes | None]
) -> list[StoredMessage]:
    decoded = []
    for index, raw in enumerate(messages):
        if raw is None:
            continue
        data = orjson.loads(raw)
        stub = stubs[index] if index < len(stubs) else None
        if stub is not None:
            data["compressed_content"] = stub.decode()
        decoded.append(StoredMessage.from_dict(data))
    return decoded


def _best(
    messages: Sequence[StoredMessage], words: Sequence[str], limit: int
) -> list[StoredMessage]:
    scored = [(score(searchable_text(m), words), m) for m in messages]
    ranked = sorted((p for p in scored if p[0] > 0), key=lambda p: (-p[0], -p[1].seq))
    return [m for _, m in ranked[:limit]]


def _decode_meta(values: Sequence[bytes | None]) -> SessionMeta:
    """The meta from the scripts' ``HMGET meta unpack(META)``: values in field order,
    None for a field never written."""
    head, active, chain, user, boundary, prompt, system_tokens, calibration, model, created, \
        updated, version, rewrite_version = values  # fmt: skip
    return SessionMeta(
        int(head or 0), int(active or 0), chain.decode() if chain else "", int(user or 0),
        int(boundary or 0), orjson.loads(prompt) if prompt else None, int(system_tokens or 0),
        float(calibration or 1.0), model.decode() if model else "", float(created or 0.0),
        float(updated or 0.0), int(version or 0), int(rewrite_version or 0),
    )  # fmt: skip


# the scripts read the meta in this order (META in lua/prelude.lua)
if tuple(f.name for f in fields(SessionMeta)) != (
    "head_seq", "active_count", "head_chain", "last_user_seq", "boundary_seq", "system_prompt",
    "system_tokens", "calibration", "model", "created_at", "updated_at", "version",
    "rewrite_version",
):  # fmt: skip
    raise ImportError(
        "SessionMeta fields changed: update META in storage/lua/prelude.lua and "
        "storage/redis.py _decode_meta"
    )
