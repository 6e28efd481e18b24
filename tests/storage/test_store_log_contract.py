"""The Store contract, continued: the whole log (``read_log``) and the search of a
session's messages (``search_messages``). Every test runs against every backend (see
``conftest.store``); the SQLite index's migration closes the file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from contract_support import KEY, assistant, message, user

from storage.base import Store
from storage.sqlite import SqliteStore
from strategies.records import SessionKey, TurnWrite

OTHER = SessionKey("ns-1", "agent-a", "session-2")


async def append(store: Store, *texts: str, key: SessionKey = KEY, **write: object) -> list[int]:
    messages = [(user if i % 2 == 0 else assistant)(t) for i, t in enumerate(texts)]
    result = await store.append_turn(key, TurnWrite(messages, **write))  # type: ignore[arg-type]
    return result.seqs


async def test_read_log_pages_through_every_message_in_seq_order(store: Store) -> None:
    await append(store, *(f"message {i}" for i in range(1, 8)))
    first = await store.read_log(KEY, limit=3)
    assert [m.content for m in first.messages] == ["message 1", "message 2", "message 3"]
    assert first.next_after == 3
    second = await store.read_log(KEY, after=3, limit=3)
    assert [m.seq for m in second.messages] == [4, 5, 6]
    last = await store.read_log(KEY, after=second.next_after or 0, limit=3)
    assert [m.seq for m in last.messages] == [7]
    assert last.next_after is None


async def test_read_log_includes_superseded_messages_and_names_them(store: Store) -> None:
    await append(store, "question", "first answer", "follow-up", "second answer")
    await append(store, "again", supersede_after=2)
    page = await store.read_log(KEY)
    assert [m.content for m in page.messages] == [
        "question", "first answer", "follow-up", "second answer", "again",
    ]
    assert page.superseded == {3, 4}
    assert page.next_after is None


async def test_read_log_keeps_the_original_beside_its_stub(store: Store) -> None:
    await append(store, "a long tool output", "ok")
    await store.set_compressed(KEY, {1: "[stub]"})
    (first, _) = (await store.read_log(KEY)).messages
    assert (first.content, first.compressed_content) == ("a long tool output", "[stub]")


async def test_read_log_of_a_missing_session_is_empty(store: Store) -> None:
    page = await store.read_log(KEY)
    assert (page.messages, page.superseded, page.next_after) == ([], set(), None)


async def test_search_finds_matching_messages_best_first(store: Store) -> None:
    await append(store, "the deploy key lives in vault", "noted", "lunch at noon",
                 "vault audit done", "vault deploy key rotated")
    found = await store.search_messages(KEY, ["vault", "deploy"], limit=5)
    # both words before one of them; among equals the newest first
    assert [m.seq for m in found] == [5, 1, 4]
    assert found[0].content == "vault deploy key rotated"


async def test_search_matches_words_case_folded_not_substrings(store: Store) -> None:
    await append(store, "Kubernetes Cluster upgraded", "clusters are many")
    found = await store.search_messages(KEY, ["cluster"])
    assert [m.seq for m in found] == [1]


async def test_search_leaves_out_excluded_seqs_superseded_messages_and_other_sessions(
    store: Store,
) -> None:
    await append(store, "alpha one", "alpha two", "alpha three")
    await append(store, "alpha four", supersede_after=2)
    await append(store, "alpha elsewhere", key=OTHER)
    found = await store.search_messages(KEY, ["alpha"], exclude=[1])
    assert sorted(m.seq for m in found) == [2, 4]


async def test_search_reads_the_original_of_a_compressed_message(store: Store) -> None:
    await append(store, "the migration failed on table invoices", "ok")
    await store.set_compressed(KEY, {1: "[compressed]"})
    (found,) = await store.search_messages(KEY, ["invoices"])
    assert (found.seq, found.compressed_content) == (1, "[compressed]")


async def test_search_finds_tool_call_arguments(store: Store) -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": '{"city": "Reykjavik"}'}}
    write = TurnWrite([user("weather?"), message("assistant", "", tool_calls=[call])])
    await store.append_turn(KEY, write)
    (found,) = await store.search_messages(KEY, ["reykjavik"])
    assert found.seq == 2


async def test_search_without_words_or_matches_finds_nothing(store: Store) -> None:
    await append(store, "some text")
    assert await store.search_messages(KEY, []) == []
    assert await store.search_messages(KEY, ["absent"]) == []
    assert await store.search_messages(OTHER, ["some"]) == []


async def test_messages_appended_after_a_search_are_found_by_the_next(store: Store) -> None:
    await append(store, "first batch about pumpkins")
    assert len(await store.search_messages(KEY, ["pumpkins"])) == 1
    await append(store, "second batch about pumpkins")
    assert [m.seq for m in await store.search_messages(KEY, ["pumpkins"])] == [2, 1]


async def test_a_deleted_session_is_no_longer_found(store: Store) -> None:
    await append(store, "secret plan")
    assert len(await store.search_messages(KEY, ["secret"])) == 1
    assert await store.delete_session(KEY)
    await append(store, "a new life")
    assert await store.search_messages(KEY, ["secret"]) == []
    assert [m.seq for m in await store.search_messages(KEY, ["life"])] == [1]


async def test_a_sqlite_database_from_before_the_index_finds_its_messages(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    store = SqliteStore(url)
    await store.open()
    await append(store, "written before the index", "ok")
    await store.close()
    conn = sqlite3.connect(tmp_path / "store.db")
    conn.executescript("DROP TABLE messages_fts; DROP TABLE fts_indexed;")
    conn.close()
    reopened = SqliteStore(url)
    await reopened.open()
    try:
        (found,) = await reopened.search_messages(KEY, ["before"])
        assert found.content == "written before the index"
        await append(reopened, "and after")
        assert [m.seq for m in await reopened.search_messages(KEY, ["after"])] == [3]
    finally:
        await reopened.close()
