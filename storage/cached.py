"""``CachedStore``: a version-checked cache of loaded sessions in front of any ``Store``.

A turn loads its session's page (``Store.load``) and appends to it. The cache keeps the
page a load returned, by session and ``LoadSpec``, with the session's ``meta.version``.
The next load of the same session and spec asks the store with that version as a
precondition (``held_version``): while nobody wrote to the session since, the store reads
only the meta, the agent's config and the probe match, in the same round trip, and the
page comes from here. Any other write, by this process or another one (a second worker,
a replica, the admin), moved the version: the store reads the page again, and it is kept
in place of the old one.

A turn written through the cache (``append_turn``) grows the page it holds when the
write was the only one since (the version moved by exactly one, the chain the store
computed is the one computed here): the records are decoded from what was stored, the
store's own encoding, so the page is what the store would read. Any other write through
the cache drops the session's pages; a write that fails leaves them as they were (the
next load checks the version anyway).

A paged turn (summarizing_window reads the pages before its load's page until the
window's budget is full, ``Store.get_range``) reads those older records through the
cache too: the records just before a cached page are kept with it (``Page.older``), as
read at the page's version, and a range they cover is served from them. The page's own
records that a grown page leaves behind join them, so a session's next turns read no
older page again while nobody else writes to it. They go with the page.

Records are values: the cache keeps its own, hands the same records to every turn, and
never changes one (a change is a new record). Bounded by an estimate of the memory it
holds (``MEMORY_PROXY_SESSION_CACHE_MB``; a message is counted as ``MESSAGE_OVERHEAD``
bytes plus 4 per token, plus its ids and name, which tokens do not count), least recently
used first out.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from storage.base import Store
from storage.codec import encode_message, message_from_body
from strategies.records import (
    AgentInfo,
    AppendResult,
    LoadSpec,
    LogPage,
    RangeBudget,
    ResponseRef,
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
    chain_hash,
    with_stubs,
)

__all__ = ["CachedStore", "estimated_bytes"]

# the record, its fingerprint and chain strings, its meta dict and the list slot
MESSAGE_OVERHEAD = 600
BYTES_PER_TOKEN = 4
# an entry's own: the dataclass, its key and the OrderedDict's link, besides its strings
ENTRY_OVERHEAD = 300
# a page's older records: at most this many pages' worth (``LoadSpec.limit``)
OLDER_PAGES = 16

Slot = tuple[SessionKey, LoadSpec]


def estimated_bytes(messages: Sequence[StoredMessage]) -> int:
    size = MESSAGE_OVERHEAD * len(messages) + BYTES_PER_TOKEN * sum([m.tokens for m in messages])
    for message in messages:
        if message.tool_call_id or message.tool_calls or message.name:
            size += len(message.tool_call_id or "") + len(message.name or "")
            for call in message.tool_calls or ():
                if isinstance(call, dict):
                    size += len(str(call.get("id") or ""))
    return size


@dataclass(frozen=True, slots=True)
class Page:
    """What ``Store.load(key, spec)`` returned at ``version`` (the session's head chain
    then, to check an append against)."""

    version: int
    head_chain: str
    messages: tuple[StoredMessage, ...]
    summaries: tuple[SummaryRecord, ...]
    size: int  # estimated bytes, the key's included (and the older records')
    # the active records just before ``messages``, contiguous with them (get_range's)
    older: tuple[StoredMessage, ...] = ()


class CachedStore:
    """A ``Store`` that serves unchanged sessions' pages from memory (at most
    ``max_bytes``, estimated; 0 keeps nothing and every call goes through)."""

    def __init__(self, store: Store, max_bytes: int) -> None:
        self.store = store
        self.max_bytes = max_bytes
        # by session, least recently used first; a session's pages by spec (mostly one)
        self._sessions: OrderedDict[SessionKey, dict[LoadSpec, Page]] = OrderedDict()
        self._size = 0
        self.hits = 0  # loads served from the cache
        self.misses = 0  # loads that read their page from the store

    def __len__(self) -> int:
        return sum(len(pages) for pages in self._sessions.values())

    @property
    def size(self) -> int:
        """Estimated bytes held across every cached page, their keys included."""
        return self._size

    async def load(
        self,
        key: SessionKey,
        spec: LoadSpec,
        *,
        probe: Sequence[str] = (),
        held_version: int | None = None,
    ) -> SessionSnapshot:
        if self.max_bytes <= 0 or held_version is not None:
            return await self.store.load(key, spec, probe=probe, held_version=held_version)
        slot = (key, spec)
        page = self._sessions.get(key, {}).get(spec)
        snapshot = await self.store.load(
            key, spec, probe=probe, held_version=None if page is None else page.version
        )
        if snapshot.held and page is not None:
            # ``page`` was read at the version the store still has: the page to serve,
            # whatever came into the cache meanwhile
            self.hits += 1
            if key in self._sessions:
                self._sessions.move_to_end(key)
            snapshot.messages = list(page.messages)
            snapshot.summaries = list(page.summaries)
            snapshot.held = False
            return snapshot
        self.misses += 1
        if snapshot.exists:
            messages = tuple(snapshot.messages)
            self._put(slot, Page(
                snapshot.meta.version, snapshot.meta.head_chain, messages,
                tuple(snapshot.summaries), estimated_bytes(messages) + _key_bytes(key),
            ))  # fmt: skip
        else:
            self._drop(slot)
        return snapshot

    async def append_turn(self, key: SessionKey, write: TurnWrite) -> AppendResult:
        result = await self.store.append_turn(key, write)
        for spec in list(self._sessions.get(key, ())):
            self._grow((key, spec), write, result)
        return result

    def _grow(self, slot: Slot, write: TurnWrite, result: AppendResult) -> None:
        """The page of ``slot`` as the store holds it after ``write``, when that write was
        the only one since the page was read; else it goes."""
        page = self._sessions[slot[0]][slot[1]]
        meta = result.meta
        if (
            meta.version != page.version + 1
            or write.supersede_after is not None
            or len(result.seqs) != len(write.messages)
            or any(not message.created_at for message in write.messages)
        ):
            self._drop(slot)
            return
        chain, appended = page.head_chain, []
        for message, seq in zip(write.messages, result.seqs, strict=True):
            chain = chain_hash(chain, message.fingerprint)
            # the store's own encoding, read back: the record a load would return
            body = orjson.loads(encode_message(message, message.created_at))
            appended.append(message_from_body(body, seq, chain, message.compressed_content or None))
        if chain != meta.head_chain:
            self._drop(slot)
            return
        spec = slot[1]
        start = {"all": 0, "boundary": meta.boundary_seq + 1, "turn": meta.last_user_seq}
        stubs = write.compressed or {}
        messages = (*with_stubs(page.messages, stubs), *appended)
        # the page starts at the spec's start and holds at most its limit, the newest
        first = bisect_left(messages, start[spec.since], key=_seq)
        first = max(first, len(messages) - spec.limit) if spec.limit > 0 else len(messages)
        # what the page leaves behind stays next to the older records it reaches, at most
        # OLDER_PAGES pages of them (stubs do not change a record's estimate)
        older: tuple[StoredMessage, ...] = ()
        gone: Sequence[StoredMessage] = messages[:first]
        if page.older:
            joined = (*with_stubs(page.older, stubs), *gone)
            kept = min(len(joined), OLDER_PAGES * spec.limit) if spec.limit > 0 else 0
            older = joined[len(joined) - kept :] if kept else ()
            gone = joined[: len(joined) - kept]
        size = page.size + estimated_bytes(appended) - estimated_bytes(gone)
        self._put(slot, Page(
            meta.version, meta.head_chain, messages[first:], page.summaries, size, older,
        ))  # fmt: skip

    async def set_compressed(self, key: SessionKey, stubs: dict[int, str | None]) -> None:
        try:
            await self.store.set_compressed(key, stubs)
        finally:
            self.forget(key)

    async def add_summary(
        self, key: SessionKey, summary: SummaryRecord, *, expect_boundary: int | None = None
    ) -> SummaryRecord | None:
        try:
            return await self.store.add_summary(key, summary, expect_boundary=expect_boundary)
        finally:
            self.forget(key)

    async def delete_session(self, key: SessionKey) -> bool:
        try:
            return await self.store.delete_session(key)
        finally:
            self.forget(key)

    def forget(self, key: SessionKey) -> None:
        """Drop every page of the session (each is checked by the next load anyway)."""
        pages = self._sessions.pop(key, {})
        self._size -= sum(page.size for page in pages.values())

    def _put(self, slot: Slot, page: Page) -> None:
        self._drop(slot)
        if page.size > self.max_bytes:
            return
        key, spec = slot
        self._sessions.setdefault(key, {})[spec] = page
        self._sessions.move_to_end(key)
        self._size += page.size
        while self._size > self.max_bytes:
            _, pages = self._sessions.popitem(last=False)
            self._size -= sum(page.size for page in pages.values())

    def _drop(self, slot: Slot) -> None:
        key, spec = slot
        pages = self._sessions.get(key)
        page = None if pages is None else pages.pop(spec, None)
        if page is not None:
            self._size -= page.size
        if pages is not None and not pages:
            del self._sessions[key]

    # Everything else goes straight through.

    async def open(self) -> None:
        await self.store.open()

    async def close(self) -> None:
        self._sessions.clear()
        self._size = 0
        await self.store.close()

    async def ping(self) -> bool:
        return await self.store.ping()

    async def get_messages(self, key: SessionKey, seqs: Sequence[int]) -> list[StoredMessage]:
        return await self.store.get_messages(key, seqs)

    async def get_range(
        self, key: SessionKey, from_seq: int, to_seq: int, *, budget: RangeBudget | None = None
    ) -> list[StoredMessage]:
        """From the older records of the session's cached page when they reach the range:
        the store is read only for what lies before them (with what is left of
        ``budget``), which joins them. The older records kept start where the latest range
        did (the budget's start moves forward as the session grows), so they stay the size
        of one window."""
        slot = self._older_slot(key, to_seq)
        if slot is None:
            return await self.store.get_range(key, from_seq, to_seq, budget=budget)
        page = self._sessions[key][slot[1]]
        held = (*page.older, *page.messages)
        start = bisect_left(held, from_seq, key=_seq)
        end = bisect_left(held, to_seq + 1, key=_seq)
        rest = budget
        if budget is not None:  # the held records first, newest first
            taken = budget.take(reversed(held[start:end]))
            start = end - len(taken)
            rest = replace(budget, tokens=budget.tokens - sum(map(budget.size, taken)))
        before: list[StoredMessage] = []
        if from_seq < held[0].seq and (rest is None or rest.tokens > 0):
            before = await self.store.get_range(key, from_seq, held[0].seq - 1, budget=rest)
            if self._sessions.get(key, {}).get(slot[1]) is not page:  # changed meanwhile
                return await self.store.get_range(key, from_seq, to_seq, budget=budget)
        cut = min(start, len(page.older))
        if before or cut:
            size_now = page.size + estimated_bytes(before) - estimated_bytes(page.older[:cut])
            self._put(slot, replace(page, older=(*before, *page.older[cut:]), size=size_now))
        return [*before, *held[start:end]]

    def _older_slot(self, key: SessionKey, to_seq: int) -> Slot | None:
        """The slot of a paged spec's cached page of ``key`` whose records reach back to
        ``to_seq`` or start just after it, ending at or after it."""
        for spec, page in self._sessions.get(key, {}).items():
            if spec.since != "all" or spec.fill_ratio is None or not page.messages:
                continue
            first = (page.older or page.messages)[0].seq
            if first <= to_seq + 1 and to_seq <= page.messages[-1].seq:
                return key, spec
        return None

    async def find_tool_result(self, key: SessionKey, tool_call_id: str) -> StoredMessage | None:
        return await self.store.find_tool_result(key, tool_call_id)

    async def find_response(self, key: SessionKey, response_id: str) -> ResponseRef | None:
        return await self.store.find_response(key, response_id)

    async def forget_response(self, key: SessionKey, response_id: str) -> bool:
        # the session's messages and meta are untouched: the cached page stays valid
        return await self.store.forget_response(key, response_id)

    async def read_log(self, key: SessionKey, *, after: int = 0, limit: int = 100) -> LogPage:
        return await self.store.read_log(key, after=after, limit=limit)

    async def search_messages(
        self,
        key: SessionKey,
        words: Sequence[str],
        *,
        exclude: Sequence[int] = (),
        limit: int = 5,
    ) -> list[StoredMessage]:
        return await self.store.search_messages(key, words, exclude=exclude, limit=limit)

    async def set_calibration(self, key: SessionKey, value: float) -> None:
        await self.store.set_calibration(key, value)

    async def list_agents(self) -> list[AgentInfo]:
        return await self.store.list_agents()

    async def list_sessions(self, agent: str, *, limit: int = 200) -> list[SessionInfo]:
        return await self.store.list_sessions(agent, limit=limit)

    async def find_sessions(self, agent: str, session: str) -> list[SessionInfo]:
        return await self.store.find_sessions(agent, session)

    async def count_sessions(self, namespace: str) -> int:
        return await self.store.count_sessions(namespace)

    async def get_agent_config(self, agent: str) -> dict[str, Any] | None:
        return await self.store.get_agent_config(agent)

    async def set_agent_config(self, agent: str, config: dict[str, Any] | None) -> None:
        await self.store.set_agent_config(agent, config)

    async def acquire_lock(self, key: SessionKey, name: str, ttl: float) -> str | None:
        return await self.store.acquire_lock(key, name, ttl)

    async def release_lock(self, key: SessionKey, name: str, token: str) -> None:
        await self.store.release_lock(key, name, token)

    async def put_part(self, key: SessionKey, digest: str, data: bytes, media_type: str) -> None:
        await self.store.put_part(key, digest, data, media_type)

    async def get_part(self, key: SessionKey, digest: str) -> tuple[bytes, str] | None:
        return await self.store.get_part(key, digest)

    async def put_parts(self, key: SessionKey, parts: Sequence[tuple[str, bytes, str]]) -> None:
        await self.store.put_parts(key, parts)

    async def get_parts(
        self, key: SessionKey, digests: Sequence[str]
    ) -> dict[str, tuple[bytes, str]]:
        return await self.store.get_parts(key, digests)


def _seq(message: StoredMessage) -> int:
    return message.seq


def _key_bytes(key: SessionKey) -> int:
    return ENTRY_OVERHEAD + len(key.namespace) + len(key.agent) + len(key.session)
