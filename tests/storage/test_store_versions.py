"""Session versions: every write to a session's messages or summaries changes
``meta.version``, and a load whose ``held_version`` is the current version reads only the
head (the session cache's precondition, storage/cached.py). Runs against every backend
(see ``conftest.store``)."""

from __future__ import annotations

from contract_support import KEY, assistant, user

from storage.base import Store
from strategies.records import LoadSpec, SummaryRecord, TurnWrite

SPEC = LoadSpec(limit=100)


async def turn(store: Store, index: int, **write: object) -> int:
    pair = [user(f"question {index}"), assistant(f"answer {index}")]
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


async def test_an_append_moves_the_version_by_one(store: Store) -> None:
    before = await turn(store, 0)

    assert await turn(store, 1) == before + 1


async def test_a_load_at_the_current_version_reads_only_the_head(store: Store) -> None:
    await turn(store, 0)
    await store.add_summary(KEY, SummaryRecord("summary", "so far", 1, 2))
    current = await version(store)
    first = await store.load(KEY, SPEC)
    probe = [m.chain for m in first.messages]

    again = await store.load(KEY, SPEC, probe=probe, held_version=current)

    assert again.held and again.exists
    assert again.messages == [] and again.summaries == []
    assert again.meta == first.meta
    assert (again.matched, again.matched_seq) == (2, 2)


async def test_a_load_at_an_older_version_reads_everything(store: Store) -> None:
    old = await turn(store, 0)
    await turn(store, 1)

    snapshot = await store.load(KEY, SPEC, held_version=old)

    assert not snapshot.held
    assert [m.content for m in snapshot.messages] == [
        "question 0", "answer 0", "question 1", "answer 1",
    ]  # fmt: skip


async def test_compression_stubs_written_later_are_not_hidden_by_a_held_version(
    store: Store,
) -> None:
    known = await turn(store, 0)
    await store.set_compressed(KEY, {2: "[stub]"})

    snapshot = await store.load(KEY, SPEC, held_version=known)

    assert not snapshot.held
    assert snapshot.messages[1].compressed_content == "[stub]"


async def test_a_session_deleted_and_created_again_never_repeats_a_version(store: Store) -> None:
    before = [await turn(store, i) for i in range(3)]
    await store.delete_session(KEY)

    after = [await turn(store, i) for i in range(3)]

    assert not set(before) & set(after)
    snapshot = await store.load(KEY, SPEC, held_version=before[-1])
    assert not snapshot.held


async def test_a_held_version_of_a_missing_session_loads_it_as_missing(store: Store) -> None:
    snapshot = await store.load(KEY, SPEC, held_version=12345)

    assert not snapshot.exists and not snapshot.held
