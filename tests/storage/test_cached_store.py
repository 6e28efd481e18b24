"""The session cache in front of a store (storage/cached.py), through the Store port:
what a load through it returns is what the store itself returns, whoever wrote last.
Runs on SQLite and Redis, each with a second store instance on the same database as the
other writer (another worker or replica)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from redis_server import RedisServer, flush_redis

from storage.base import Store, StoreUnavailable
from storage.cached import CachedStore
from storage.registry import open_store
from strategies.records import (
    AppendResult,
    LoadSpec,
    RangeBudget,
    SessionKey,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
)

KEY = SessionKey("ns", "agent", "session")
SPEC = LoadSpec(limit=6)


def message(role: str, text: str) -> StoredMessage:
    return StoredMessage(
        role=role,  # type: ignore[arg-type]
        content=text,
        tokens=len(text),
        fingerprint=hashlib.sha1(f"{role}:{text}".encode()).hexdigest(),
        created_at=time.time(),
        meta={"model": "m"} if role == "assistant" else {},
    )


def turn(index: int, **fields: object) -> TurnWrite:
    pair = [message("user", f"question {index}"), message("assistant", f"answer {index}")]
    return TurnWrite(pair, **fields)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of each backend (Redis flushed)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    server: RedisServer = request.getfixturevalue("redis_server")
    flush_redis(server.url)
    return server.url


@pytest.fixture
async def stores(url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two open stores on one database: the one to put behind the cache, and another
    writer."""
    first, second = open_store(url), open_store(url)
    await first.open()
    await second.open()
    yield first, second
    await first.close()
    await second.close()


@pytest.fixture
def cached(stores: tuple[Store, Store]) -> CachedStore:
    return CachedStore(stores[0], 16 << 20)


@pytest.fixture
def other(stores: tuple[Store, Store]) -> Store:
    return stores[1]


def page(snapshot: SessionSnapshot) -> list[tuple[int, str, object, str | None]]:
    return [(m.seq, m.chain, m.content, m.compressed_content) for m in snapshot.messages]


async def assert_same(cached: CachedStore, spec: LoadSpec = SPEC) -> SessionSnapshot:
    """A load through the cache returns what the store itself reads."""
    through = await cached.load(KEY, spec)
    direct = await cached.store.load(KEY, spec)
    assert through.messages == direct.messages
    assert through.summaries == direct.summaries
    assert through.meta == direct.meta and through.exists == direct.exists
    assert not through.held
    return through


async def test_an_unchanged_session_is_served_from_the_cache(cached: CachedStore) -> None:
    await cached.append_turn(KEY, turn(0))
    first = await assert_same(cached)
    hits = cached.hits

    again = await cached.load(KEY, SPEC)

    assert cached.hits == hits + 1
    assert page(again) == page(first) and again.summaries == first.summaries


async def test_a_turn_written_through_the_cache_is_what_the_store_then_reads(
    cached: CachedStore,
) -> None:
    for index in range(5):  # past the page's limit: the page keeps the newest
        await cached.load(KEY, SPEC)
        await cached.append_turn(KEY, turn(index, model="m", calibration=1.1))
        hits = cached.hits
        await assert_same(cached)
        assert cached.hits == hits + (1 if index else 0)  # the first turn created it


async def test_stubs_written_with_a_turn_are_on_the_cached_page(cached: CachedStore) -> None:
    await cached.append_turn(KEY, turn(0))
    await cached.load(KEY, SPEC)
    await cached.append_turn(KEY, turn(1, compressed={2: "[stub]"}))
    hits = cached.hits

    snapshot = await assert_same(cached)

    assert cached.hits == hits + 1
    assert snapshot.messages[1].compressed_content == "[stub]"


@pytest.mark.parametrize("spec", [LoadSpec(limit=3, since="turn"), LoadSpec(since="boundary")])
async def test_pages_from_the_boundary_or_the_turn_follow_the_turns_written(
    cached: CachedStore, spec: LoadSpec
) -> None:
    await cached.append_turn(KEY, turn(0))
    await cached.add_summary(KEY, SummaryRecord("compaction", "so far", 1, 1))
    for index in range(1, 4):
        await cached.load(KEY, spec)
        await cached.append_turn(KEY, turn(index))
        await assert_same(cached, spec)


async def test_another_writers_turn_is_seen_on_the_next_load(
    cached: CachedStore, other: Store
) -> None:
    await cached.append_turn(KEY, turn(0))
    await cached.load(KEY, SPEC)

    await other.append_turn(KEY, turn(1))

    snapshot = await assert_same(cached)
    assert [m.content for m in snapshot.messages][-1] == "answer 1"


@pytest.mark.parametrize("write", ["stubs", "summary", "rewind", "delete"])
async def test_every_other_writers_change_is_seen_on_the_next_load(
    cached: CachedStore, other: Store, write: str
) -> None:
    for index in range(2):
        await cached.append_turn(KEY, turn(index))
    await cached.load(KEY, SPEC)

    if write == "stubs":
        await other.set_compressed(KEY, {1: "[stub]"})
    elif write == "summary":
        await other.add_summary(KEY, SummaryRecord("summary", "so far", 1, 2))
    elif write == "rewind":
        await other.append_turn(KEY, turn(9, supersede_after=2))
    else:
        await other.delete_session(KEY)

    snapshot = await assert_same(cached)
    if write == "delete":
        assert not snapshot.exists and snapshot.messages == []


async def test_a_turn_written_after_another_writers_is_read_whole(
    cached: CachedStore, other: Store
) -> None:
    await cached.append_turn(KEY, turn(0))
    await cached.load(KEY, SPEC)
    await other.append_turn(KEY, turn(1))

    await cached.append_turn(KEY, turn(2))  # two writes since the page: it is not grown

    snapshot = await assert_same(cached)
    assert [m.content for m in snapshot.messages] == [
        "question 0", "answer 0", "question 1", "answer 1", "question 2", "answer 2",
    ]  # fmt: skip


@pytest.mark.parametrize("write", ["stubs", "summary", "rewind", "delete"])
async def test_the_caches_own_writes_are_seen_on_the_next_load(
    cached: CachedStore, write: str
) -> None:
    for index in range(2):
        await cached.append_turn(KEY, turn(index))
    await cached.load(KEY, SPEC)

    if write == "stubs":
        await cached.set_compressed(KEY, {1: "[stub]"})
    elif write == "summary":
        await cached.add_summary(KEY, SummaryRecord("compaction", "so far", 1, 2))
    elif write == "rewind":
        await cached.append_turn(KEY, turn(9, supersede_after=2))
    else:
        await cached.delete_session(KEY)

    await assert_same(cached)
    await assert_same(cached, LoadSpec(since="boundary"))


class LostReply:
    """A store whose next append is applied and then fails (the reply lost), or fails
    before it is applied."""

    def __init__(self, store: Store, applied: bool) -> None:
        self.store = store
        self.applied = applied

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def append_turn(self, key: SessionKey, write: TurnWrite) -> AppendResult:
        if self.applied:
            await self.store.append_turn(key, write)
        raise StoreUnavailable("the reply was lost")


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
async def test_a_failed_write_leaves_the_cache_consistent(
    stores: tuple[Store, Store], applied: bool
) -> None:
    failing = LostReply(stores[0], applied)
    cached = CachedStore(failing, 16 << 20)  # type: ignore[arg-type]
    await stores[0].append_turn(KEY, turn(0))
    await cached.load(KEY, SPEC)

    with pytest.raises(StoreUnavailable):
        await cached.append_turn(KEY, turn(1))

    snapshot = await assert_same(cached)
    assert len(snapshot.messages) == (4 if applied else 2)


async def test_the_cache_holds_at_most_its_bound(stores: tuple[Store, Store]) -> None:
    cached = CachedStore(stores[0], 8_000)
    keys = [SessionKey("ns", "agent", f"s{i}") for i in range(10)]
    for key in keys:
        await cached.append_turn(key, turn(0))
        await cached.load(key, SPEC)
        assert cached.size <= 8_000
    assert 0 < len(cached) < len(keys)
    # the oldest went first: the newest is still served from the cache
    hits = cached.hits
    await cached.load(keys[-1], SPEC)
    assert cached.hits == hits + 1


async def test_a_cache_of_no_bytes_keeps_nothing(stores: tuple[Store, Store]) -> None:
    cached = CachedStore(stores[0], 0)
    await cached.append_turn(KEY, turn(0))
    await cached.load(KEY, SPEC)

    snapshot = await cached.load(KEY, SPEC)

    assert len(cached) == 0 and cached.size == 0 and cached.hits == 0
    assert [m.content for m in snapshot.messages] == ["question 0", "answer 0"]


async def test_a_probe_is_matched_on_a_cached_page(cached: CachedStore) -> None:
    await cached.append_turn(KEY, turn(0))
    first = await cached.load(KEY, SPEC)
    probe: Sequence[str] = [m.chain for m in first.messages]

    again = await cached.load(KEY, SPEC, probe=probe)

    assert (again.matched, again.matched_seq) == (2, 2)
    assert page(again) == page(first)


PAGED = LoadSpec(limit=4, since="all", fill_ratio=0.8)


class CountingRanges:
    """The store behind the cache, its ``get_range`` calls counted."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.ranges: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def get_range(
        self, key: SessionKey, from_seq: int, to_seq: int, *, budget: RangeBudget | None = None
    ) -> list[StoredMessage]:
        self.ranges.append((from_seq, to_seq))
        return await self.store.get_range(key, from_seq, to_seq, budget=budget)


async def paged_turn(cached: CachedStore, index: int) -> list[StoredMessage]:
    """A paged turn as the proxy makes it: the page, the history before it, then the
    turn's write. Returns what the turn read."""
    snapshot = await cached.load(KEY, PAGED)
    first = snapshot.messages[0].seq
    before = await cached.get_range(KEY, 1, first - 1) if first > 1 else []
    await cached.append_turn(KEY, turn(index))
    return [*before, *snapshot.messages]


async def test_a_paged_sessions_older_records_are_read_from_the_store_once(
    stores: tuple[Store, Store],
) -> None:
    counting = CountingRanges(stores[0])
    cached = CachedStore(counting, 16 << 20)  # type: ignore[arg-type]
    for index in range(4):
        await cached.append_turn(KEY, turn(index))

    for index in range(4, 10):
        read = await paged_turn(cached, index)
        direct = await stores[0].get_range(KEY, 1, read[-1].seq)
        assert read == direct, "the history read through the cache is the store's"

    assert len(counting.ranges) == 1, "only the first turn read the older pages"


async def test_older_records_follow_another_writers_changes(
    cached: CachedStore, other: Store
) -> None:
    for index in range(6):
        await cached.append_turn(KEY, turn(index))
    await paged_turn(cached, 6)

    await other.set_compressed(KEY, {1: "[stub]"})  # a record before the page
    await other.append_turn(KEY, turn(9, supersede_after=3))  # and a rewind

    snapshot = await cached.load(KEY, PAGED)
    before = await cached.get_range(KEY, 1, snapshot.messages[0].seq - 1)
    direct = await other.get_range(KEY, 1, snapshot.messages[-1].seq)
    assert [*before, *snapshot.messages] == direct
    assert before[0].compressed_content == "[stub]"


async def test_a_range_inside_the_older_records_is_what_the_store_returns(
    cached: CachedStore,
) -> None:
    for index in range(8):
        await cached.append_turn(KEY, turn(index))
    await paged_turn(cached, 8)
    await paged_turn(cached, 9)

    for low, high in [(1, 3), (2, 2), (5, 11), (3, 17), (18, 19), (12, 40), (4, 6)]:
        assert await cached.get_range(KEY, low, high) == await cached.store.get_range(
            KEY, low, high
        )


async def test_a_budgeted_range_through_the_cache_is_what_the_store_returns(
    cached: CachedStore,
) -> None:
    for index in range(8):
        await cached.append_turn(KEY, turn(index))
    await paged_turn(cached, 8)
    await paged_turn(cached, 9)

    for low, high in [(1, 14), (3, 14), (5, 11), (12, 14), (1, 3), (12, 40)]:
        for tokens in (0, 8, 9, 30, 1000):
            budget = RangeBudget(tokens)
            assert await cached.get_range(KEY, low, high, budget=budget) == (
                await cached.store.get_range(KEY, low, high, budget=budget)
            ), (low, high, tokens)


async def test_a_budget_the_older_records_hold_is_served_without_the_store(
    stores: tuple[Store, Store],
) -> None:
    counting = CountingRanges(stores[0])
    cached = CachedStore(counting, 16 << 20)  # type: ignore[arg-type]
    for index in range(6):
        await cached.append_turn(KEY, turn(index))
    await paged_turn(cached, 6)  # reads the records before its page once
    read = len(counting.ranges)
    first = (await cached.load(KEY, PAGED)).messages[0].seq

    held = await cached.get_range(KEY, 1, first - 1, budget=RangeBudget(30))
    assert held == await stores[0].get_range(KEY, 1, first - 1, budget=RangeBudget(30))
    assert len(counting.ranges) == read

    # a larger budget: the older records it no longer holds come from the store, the
    # records below them only, with what is left of the budget
    more = await cached.get_range(KEY, 1, first - 1, budget=RangeBudget(60))
    assert more == await stores[0].get_range(KEY, 1, first - 1, budget=RangeBudget(60))
    assert counting.ranges[read:] == [(1, held[0].seq - 1)]
    assert len(more) > len(held)
