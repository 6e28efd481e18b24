"""Session versions: every write to a session's messages or summaries changes
``meta.version``, a load that already knows the current version reads only the head, and
one that knows an older version and head of a session that only grew since reads only what
was appended. Runs against every backend (see ``conftest.store``)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

import pytest

from storage.base import Store
from storage.redis import RedisStore, _keys
from storage.redis_client import connect, disconnect
from storage.sqlite import SqliteStore
from strategies.records import LoadSpec, SessionKey, StoredMessage, SummaryRecord, TurnWrite

KEY = SessionKey("ns-1", "agent-a", "session-1")
SPEC = LoadSpec(limit=100)


def message(role: str, text: str) -> StoredMessage:
    fingerprint = hashlib.sha1(f"{role}:{text}".encode()).hexdigest()
    return StoredMessage(role=role, content=text, tokens=len(text), fingerprint=fingerprint)  # type: ignore[arg-type]


async def turn(store: Store, index: int, **write: object) -> int:
    pair = [message("user", f"question {index}"), message("assistant", f"answer {index}")]
    result = await store.append_turn(KEY, TurnWrite(pair, **write))  # type: ignore[arg-type]
    return result.meta.version


async def version(store: Store) -> int:
    return (await store.load(KEY, LoadSpec(limit=0))).meta.version


async def test_every_write_to_messages_or_summaries_moves_the_version_forward(
    store: Store,
) -> None:
    seen = [await turn(store, 0)]
    seen.append(await turn(store, 1))
    await store.set_compressed(KEY, {2: "[stub]"})
    seen.append(await version(store))
    await store.add_summary(KEY, SummaryRecord("summary", "so far", 1, 2))
    seen.append(await version(store))
    await store.add_summary(KEY, SummaryRecord("compaction", "so far", 1, 2))
    seen.append(await version(store))
    seen.append(await turn(store, 2, supersede_after=2))

    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)


async def test_append_result_reports_the_version_a_load_then_sees(store: Store) -> None:
    reported = await turn(store, 0)

    assert reported == await version(store)


async def test_a_load_at_the_current_version_reads_only_the_head(store: Store) -> None:
    await turn(store, 0)
    await store.add_summary(KEY, SummaryRecord("summary", "so far", 1, 2))
    current = await version(store)
    first = await store.load(KEY, SPEC)
    probe = [m.chain for m in first.messages]

    again = await store.load(KEY, SPEC, probe=probe, known_version=current)

    assert again.unchanged and again.exists
    assert again.messages == [] and again.summaries == []
    assert again.meta == first.meta
    assert (again.matched, again.matched_seq) == (2, 2)


async def test_a_load_at_an_older_version_reads_everything(store: Store) -> None:
    old = await turn(store, 0)
    await turn(store, 1)

    snapshot = await store.load(KEY, SPEC, known_version=old)

    assert not snapshot.unchanged
    assert [m.content for m in snapshot.messages] == [
        "question 0", "answer 0", "question 1", "answer 1",
    ]  # fmt: skip


async def test_compression_stubs_written_later_are_not_hidden_by_a_known_version(
    store: Store,
) -> None:
    known = await turn(store, 0)
    await store.set_compressed(KEY, {2: "[stub]"})

    snapshot = await store.load(KEY, SPEC, known_version=known)

    assert not snapshot.unchanged
    assert snapshot.messages[1].compressed_content == "[stub]"


async def test_a_session_deleted_and_created_again_never_repeats_a_version(store: Store) -> None:
    before = [await turn(store, i) for i in range(3)]
    await store.delete_session(KEY)

    after = [await turn(store, i) for i in range(3)]

    assert not set(before) & set(after)
    snapshot = await store.load(KEY, SPEC, known_version=before[-1])
    assert not snapshot.unchanged


async def test_a_known_version_of_a_missing_session_loads_it_as_missing(store: Store) -> None:
    snapshot = await store.load(KEY, SPEC, known_version=12345)

    assert not snapshot.exists and not snapshot.unchanged


# -- a known head: a session that only grew since is read from there (another worker or
# replica appended the turns between)


async def held(store: Store, spec: LoadSpec = SPEC) -> tuple[int, int]:
    """The version and head a process holding the session now would pass."""
    meta = (await store.load(KEY, spec)).meta
    return meta.version, meta.head_seq


async def test_a_session_that_only_grew_is_read_from_the_known_head(store: Store) -> None:
    await turn(store, 0)
    await store.add_summary(KEY, SummaryRecord("summary", "so far", 1, 2))
    version_held, head = await held(store)
    await turn(store, 1)
    await turn(store, 2)

    snapshot = await store.load(KEY, SPEC, known_version=version_held, known_head=head)

    assert snapshot.grown and snapshot.exists and not snapshot.unchanged
    assert [m.content for m in snapshot.messages] == [
        "question 1", "answer 1", "question 2", "answer 2",
    ]  # fmt: skip
    assert [m.seq for m in snapshot.messages] == [3, 4, 5, 6]
    assert snapshot.summaries == []  # unchanged: the caller holds them
    full = await store.load(KEY, SPEC)
    assert snapshot.meta == full.meta
    assert snapshot.messages == full.messages[2:]


async def test_a_grown_read_keeps_the_limit_and_the_probe(store: Store) -> None:
    await turn(store, 0)
    version_held, head = await held(store, LoadSpec(limit=3))
    for index in range(1, 4):
        await turn(store, index)
    probe = [m.chain for m in (await store.load(KEY, SPEC)).messages]

    snapshot = await store.load(
        KEY, LoadSpec(limit=3), probe=probe, known_version=version_held, known_head=head
    )

    assert snapshot.grown
    assert [m.content for m in snapshot.messages] == ["answer 2", "question 3", "answer 3"]
    assert (snapshot.matched, snapshot.matched_seq) == (8, 8)


async def test_a_grown_read_from_the_boundary_starts_after_it(store: Store) -> None:
    for index in range(2):
        await turn(store, index)
    await store.add_summary(KEY, SummaryRecord("compaction", "so far", 1, 4))
    spec = LoadSpec(since="boundary")
    version_held, head = await held(store, spec)
    await turn(store, 2)

    snapshot = await store.load(KEY, spec, known_version=version_held, known_head=head)

    assert snapshot.grown
    assert [m.content for m in snapshot.messages] == ["question 2", "answer 2"]


async def rewind(store: Store) -> None:
    await turn(store, 9, supersede_after=2)


async def stubs_by_a_turn(store: Store) -> None:
    await turn(store, 9, compressed={2: "[stub]"})


async def stubs_by_compression(store: Store) -> None:
    await store.set_compressed(KEY, {2: "[stub]"})
    await turn(store, 9)


async def a_summary(store: Store) -> None:
    await store.add_summary(KEY, SummaryRecord("summary", "so far", 1, 2))
    await turn(store, 9)


async def a_compaction(store: Store) -> None:
    await store.add_summary(KEY, SummaryRecord("compaction", "so far", 1, 2))
    await turn(store, 9)


@pytest.mark.parametrize(
    "rewrite", [rewind, stubs_by_a_turn, stubs_by_compression, a_summary, a_compaction]
)
async def test_after_any_write_that_did_more_than_append_everything_is_read(
    store: Store, rewrite: Callable[[Store], Awaitable[None]]
) -> None:
    await turn(store, 0)
    await turn(store, 1)
    version_held, head = await held(store)
    await turn(store, 2)
    await rewrite(store)
    await turn(store, 3)

    snapshot = await store.load(KEY, SPEC, known_version=version_held, known_head=head)

    assert not snapshot.grown and not snapshot.unchanged
    assert snapshot == await store.load(KEY, SPEC)


async def test_a_session_deleted_and_created_again_is_read_whole(store: Store) -> None:
    await turn(store, 0)
    version_held, head = await held(store)
    await store.delete_session(KEY)
    for index in range(3):
        await turn(store, index)

    snapshot = await store.load(KEY, SPEC, known_version=version_held, known_head=head)

    assert not snapshot.grown
    assert len(snapshot.messages) == 6


async def test_without_a_known_head_a_grown_session_is_read_whole(store: Store) -> None:
    version_held = await turn(store, 0)
    await turn(store, 1)

    snapshot = await store.load(KEY, SPEC, known_version=version_held)

    assert not snapshot.grown and len(snapshot.messages) == 4


async def forget_rewrites(store: Store) -> None:
    """The session as a version that kept no ``rewrite_version`` left it."""
    if isinstance(store, SqliteStore):
        await store._submit(lambda conn: conn.execute(
            "UPDATE sessions SET meta = json_remove(meta, '$.rewrite_version')"))
    else:
        assert isinstance(store, RedisStore)
        client = connect(store.url)  # a client of its own, beside the store's
        await client.hdel(_keys(KEY, "meta")[0], "rewrite_version")
        await disconnect(client)


async def test_a_session_stored_before_rewrites_were_kept_is_read_whole_until_it_grows(
    store: Store,
) -> None:
    await turn(store, 0)
    version_held, head = await held(store)
    # a process of a version that kept no rewrites writes stubs...
    await store.set_compressed(KEY, {2: "[stub]"})
    await forget_rewrites(store)
    before_turn, head_before_turn = await held(store)
    # ...then this version appends
    await turn(store, 1)

    snapshot = await store.load(KEY, SPEC, known_version=version_held, known_head=head)
    assert not snapshot.grown  # what came before that turn is not known to have only grown
    assert snapshot.messages[1].compressed_content == "[stub]"

    snapshot = await store.load(
        KEY, SPEC, known_version=before_turn, known_head=head_before_turn
    )
    assert snapshot.grown  # that turn only appended
    assert [m.content for m in snapshot.messages] == ["question 1", "answer 1"]
