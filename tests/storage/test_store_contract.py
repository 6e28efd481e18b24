"""The Store contract: every test runs against every backend (see ``conftest.store``).

The backend-specific sections at the end hold what only one backend can show: Redis round
trips, hash tags and outages; SQLite durability on disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from contract_support import KEY, append, assistant, chains, conversation, load, message, tool, user
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis_server import RedisServer, free_port, redis_server_available

from storage.base import Store, StoreUnavailable
from storage.redis import SOCKET_TIMEOUT, RedisStore
from storage.sqlite import SqliteStore
from strategies.records import (
    LoadSpec,
    RangeBudget,
    SessionKey,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
    chain_hash,
)

# --- loading ---------------------------------------------------------------------------


async def test_a_missing_session_loads_as_empty(store: Store) -> None:
    snapshot = await store.load(KEY, LoadSpec(), probe=["abc"])

    assert snapshot.exists is False
    assert snapshot.messages == [] and snapshot.summaries == []
    assert (snapshot.matched, snapshot.matched_seq) == (0, 0)
    assert snapshot.meta.head_seq == 0 and snapshot.meta.calibration == 1.0


async def test_append_assigns_consecutive_seqs_and_chained_hashes(store: Store) -> None:
    first = [user("hi"), assistant("hello")]
    second = [user("how are you"), assistant("fine")]

    assert await append(store, *first) == [1, 2]
    assert await append(store, *second) == [3, 4]

    snapshot = await store.load(KEY, LoadSpec())
    assert snapshot.exists is True
    assert [m.seq for m in snapshot.messages] == [1, 2, 3, 4]
    assert [m.chain for m in snapshot.messages] == chains(first + second)
    assert snapshot.meta.head_chain == chains(first + second)[-1]


async def test_messages_round_trip_every_field_and_keep_their_token_counts(store: Store) -> None:
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]
    sent = [
        StoredMessage(role="user", content=parts, tokens=1234, fingerprint="f1", name="ann"),
        StoredMessage(
            role="assistant",
            content="",
            tokens=7,
            fingerprint="f2",
            tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f"}}],
            meta={"finish_reason": "tool_calls", "empty": []},
            created_at=1712345678.123456,
        ),
        StoredMessage(role="tool", content="ünïcode ✓", tokens=3, fingerprint="f3",
                      tool_call_id="c1"),
    ]  # fmt: skip
    await append(store, *sent)

    loaded = (await store.load(KEY, LoadSpec())).messages

    assert loaded[0].content == parts and loaded[0].tokens == 1234 and loaded[0].name == "ann"
    assert loaded[1].content == "" and loaded[1].tokens == 7
    assert loaded[1].tool_calls == sent[1].tool_calls and loaded[1].meta == sent[1].meta
    assert loaded[1].created_at == 1712345678.123456
    assert loaded[2].content == "ünïcode ✓" and loaded[2].tool_call_id == "c1"
    assert [m.fingerprint for m in loaded] == ["f1", "f2", "f3"]
    assert loaded[0].created_at > 0


async def test_a_replys_window_and_cache_meta_round_trip_in_the_turns_append(
    store: Store,
) -> None:
    # what proxy/turn/prompt_cache.py writes on a reply's record, in the same append as the turn
    meta = {
        "model": "gpt-4o",
        "window": {"start": 1, "end": 1, "tokens": 812, "summary": 0, "marked": 0,
                   "system": "9f2c", "changes": [{"reason": "trim", "seq": 1}]},
        "cache": {"prompt": 830, "cached": 768, "written": 0},
    }
    await append(store, StoredMessage(role="user", content="q", tokens=1, fingerprint="u"),
                 StoredMessage(role="assistant", content="a", tokens=1, fingerprint="a",
                               meta=meta))
    loaded = (await store.load(KEY, LoadSpec())).messages
    assert loaded[1].meta == meta
    assert (await store.get_range(KEY, 2, 2))[0].meta == meta


async def test_meta_tracks_the_head_and_the_latest_user_message(store: Store) -> None:
    await append(store, user("q1"), assistant("a1", ["c1"]), tool("c1", "r1"))
    result = await store.append_turn(KEY, TurnWrite([assistant("a2"), user("q2")]))

    assert result.meta.head_seq == 5 and result.meta.active_count == 5
    assert result.meta.last_user_seq == 5
    meta = (await store.load(KEY, LoadSpec())).meta
    assert (meta.head_seq, meta.active_count, meta.last_user_seq) == (5, 5, 5)
    assert meta.created_at > 0 and meta.updated_at >= meta.created_at


async def test_turn_write_fields_update_the_meta_only_when_given(store: Store) -> None:
    prompt = [{"role": "system", "content": "be brief"}]
    await store.append_turn(
        KEY,
        TurnWrite(
            [user("q")], system_prompt=prompt, system_tokens=3, model="gpt-4o", calibration=1.2
        ),
    )
    await store.append_turn(KEY, TurnWrite([assistant("a")]))

    meta = (await store.load(KEY, LoadSpec())).meta
    assert meta.system_prompt == prompt and meta.system_tokens == 3
    assert meta.model == "gpt-4o" and meta.calibration == 1.2

    await store.append_turn(KEY, TurnWrite([], model="gpt-4o-mini", system_tokens=0))
    meta = (await store.load(KEY, LoadSpec())).meta
    assert meta.model == "gpt-4o-mini" and meta.system_tokens == 0
    assert meta.system_prompt == prompt and meta.head_seq == 2


async def test_load_returns_the_newest_messages_up_to_the_limit_in_order(store: Store) -> None:
    await conversation(store, 5)

    assert await load(store, limit=3) == ["answer 3", "question 4", "answer 4"]
    assert len(await load(store, limit=500)) == 10
    assert await load(store, limit=0) == []


async def test_load_since_boundary_skips_compacted_messages(store: Store) -> None:
    await conversation(store, 4)
    await store.add_summary(KEY, SummaryRecord("compaction", "story so far", 1, 5))

    assert await load(store, since="boundary") == ["answer 2", "question 3", "answer 3"]
    assert await load(store, since="boundary", limit=2) == ["question 3", "answer 3"]
    assert len(await load(store, since="all")) == 8


async def test_load_since_turn_starts_at_the_latest_user_message(store: Store) -> None:
    await conversation(store, 2)
    await append(store, user("q3"), assistant("calling", ["c1"]), tool("c1", "result"))

    assert await load(store, since="turn") == ["q3", "calling", "result"]
    assert await load(store, since="turn", limit=2) == ["calling", "result"]


async def test_load_since_turn_without_a_user_message_returns_every_active_message(
    store: Store,
) -> None:
    await append(store, assistant("greeting"), assistant("more"))

    assert await load(store, since="turn") == ["greeting", "more"]


# --- probe matching ----------------------------------------------------------------------


async def test_probe_matches_the_longest_stored_prefix(store: Store) -> None:
    sent = await conversation(store, 3)
    resent = [*sent, user("new question")]

    snapshot = await store.load(KEY, LoadSpec(), probe=chains(resent))

    assert (snapshot.matched, snapshot.matched_seq) == (6, 6)


async def test_probe_of_a_shorter_history_matches_its_last_message(store: Store) -> None:
    sent = await conversation(store, 3)

    snapshot = await store.load(KEY, LoadSpec(), probe=chains(sent[:3]))

    assert (snapshot.matched, snapshot.matched_seq) == (3, 3)


async def test_probe_of_a_diverging_history_matches_up_to_the_fork(store: Store) -> None:
    sent = await conversation(store, 3)
    edited = [*sent[:2], user("edited question"), assistant("other answer")]

    snapshot = await store.load(KEY, LoadSpec(), probe=chains(edited))

    assert (snapshot.matched, snapshot.matched_seq) == (2, 2)


async def test_probe_of_a_foreign_history_matches_nothing(store: Store) -> None:
    await conversation(store, 2)

    snapshot = await store.load(KEY, LoadSpec(), probe=chains([user("x"), assistant("y")]))

    assert (snapshot.matched, snapshot.matched_seq) == (0, 0)


async def test_a_long_probe_is_matched_in_one_load(store: Store) -> None:
    sent = [message("user" if i % 2 else "assistant", f"m{i}") for i in range(3000)]
    await append(store, *sent)

    snapshot = await store.load(KEY, LoadSpec(limit=10), probe=chains(sent))

    assert (snapshot.matched, snapshot.matched_seq) == (3000, 3000)
    assert len(snapshot.messages) == 10


@pytest.mark.parametrize("fork", [1, 7, 8, 9, 72, 100, 2999])
async def test_a_long_probe_diverging_anywhere_matches_up_to_the_fork(
    store: Store, fork: int
) -> None:
    stored = [message("user", f"m{i}") for i in range(3000)]
    await append(store, *stored)
    resent = stored[:fork] + [message("user", f"other {i}") for i in range(3000 - fork)]

    snapshot = await store.load(KEY, LoadSpec(limit=1), probe=chains(resent))

    assert (snapshot.matched, snapshot.matched_seq) == (fork, fork)


# --- rewinds -----------------------------------------------------------------------------


async def test_superseded_messages_are_never_loaded(store: Store) -> None:
    await conversation(store, 3)

    result = await store.append_turn(
        KEY, TurnWrite([user("edited"), assistant("new answer")], supersede_after=2)
    )

    assert result.superseded == 4 and result.seqs == [7, 8]
    assert result.meta.active_count == 4 and result.meta.head_seq == 8
    assert await load(store) == ["question 0", "answer 0", "edited", "new answer"]
    assert [m.seq for m in (await store.load(KEY, LoadSpec())).messages] == [1, 2, 7, 8]


async def test_superseded_messages_stay_readable_by_seq(store: Store) -> None:
    await conversation(store, 2)
    await append(store, user("edited"), supersede_after=2)

    found = await store.get_messages(KEY, [3, 4, 5])

    assert [m.content for m in found] == ["question 1", "answer 1", "edited"]


async def test_superseded_chains_no_longer_match_a_probe(store: Store) -> None:
    sent = await conversation(store, 3)
    await append(store, user("edited"), supersede_after=2)

    snapshot = await store.load(KEY, LoadSpec(), probe=chains(sent))

    assert (snapshot.matched, snapshot.matched_seq) == (2, 2)


async def test_appends_after_a_rewind_chain_from_the_last_kept_message(store: Store) -> None:
    sent = await conversation(store, 3)
    new = [user("edited"), assistant("new answer")]

    await append(store, *new, supersede_after=2)

    expected = chains(sent[:2] + new)
    snapshot = await store.load(KEY, LoadSpec(), probe=expected)
    assert [m.chain for m in snapshot.messages] == expected
    assert snapshot.meta.head_chain == expected[-1]
    assert (snapshot.matched, snapshot.matched_seq) == (4, 8)


async def test_a_rewind_to_the_start_chains_from_nothing(store: Store) -> None:
    await conversation(store, 2)

    await append(store, user("fresh start"), supersede_after=0)

    snapshot = await store.load(KEY, LoadSpec())
    assert [m.chain for m in snapshot.messages] == chains([user("fresh start")])
    assert snapshot.meta.active_count == 1 and snapshot.meta.last_user_seq == 5


async def test_a_rewind_without_new_messages_moves_the_head_back(store: Store) -> None:
    sent = await conversation(store, 2)

    result = await store.append_turn(KEY, TurnWrite([], supersede_after=1))

    assert result.superseded == 3
    assert result.meta.head_chain == chains(sent[:1])[0]
    assert result.meta.last_user_seq == 1 and result.meta.active_count == 1


async def test_a_rewind_past_the_latest_user_message_moves_last_user_seq_back(
    store: Store,
) -> None:
    await conversation(store, 2)

    await append(store, assistant("regenerated"), supersede_after=2)

    snapshot = await store.load(KEY, LoadSpec(since="turn"))
    assert snapshot.meta.last_user_seq == 1
    assert [m.content for m in snapshot.messages] == ["question 0", "answer 0", "regenerated"]


async def test_supersede_until_spares_messages_appended_later(store: Store) -> None:
    await conversation(store, 2)  # seqs 1..4
    await append(store, user("concurrent"))  # seq 5, unseen by the rewinding turn

    result = await store.append_turn(
        KEY, TurnWrite([user("edited")], supersede_after=2, supersede_until=4)
    )

    assert result.superseded == 2
    assert await load(store) == ["question 0", "answer 0", "concurrent", "edited"]
    snapshot = await store.load(KEY, LoadSpec())
    assert snapshot.messages[-1].chain == chain_hash(
        snapshot.messages[-2].chain, user("edited").fingerprint
    )


async def test_a_rewind_of_nothing_supersedes_nothing(store: Store) -> None:
    sent = await conversation(store, 1)

    result = await store.append_turn(KEY, TurnWrite([user("next")], supersede_after=2))

    assert result.superseded == 0
    assert result.meta.head_chain == chains([*sent, user("next")])[-1]


# --- concurrency -------------------------------------------------------------------------


async def test_concurrent_appends_to_one_session_never_interleave(store: Store) -> None:
    writers = [
        store.append_turn(KEY, TurnWrite([user(f"q{i}"), assistant(f"a{i}")])) for i in range(50)
    ]

    results = await asyncio.gather(*writers)

    assert sorted(seq for r in results for seq in r.seqs) == list(range(1, 101))
    assert all(r.seqs[1] == r.seqs[0] + 1 for r in results)
    loaded = (await store.load(KEY, LoadSpec(limit=1000))).messages
    contents = [m.content for m in loaded]
    assert sorted(contents) == sorted([f"q{i}" for i in range(50)] + [f"a{i}" for i in range(50)])
    for question, answer in zip(contents[::2], contents[1::2], strict=True):
        assert answer == "a" + question[1:]
    assert [m.chain for m in loaded] == chains(loaded)


# --- compression and summaries -------------------------------------------------------------


async def test_set_compressed_is_lossless_and_can_be_cleared(store: Store) -> None:
    await append(store, user("q"), assistant("a", ["c1"]), tool("c1", "a very long result"))

    await store.set_compressed(KEY, {3: "[result stored as c1]", 99: "ignored"})
    compressed = (await store.load(KEY, LoadSpec())).messages[2]
    await store.set_compressed(KEY, {3: None})
    cleared = (await store.get_messages(KEY, [3]))[0]

    assert compressed.content == "a very long result"
    assert compressed.compressed_content == "[result stored as c1]"
    assert cleared.content == "a very long result" and cleared.compressed_content is None
    assert compressed.tokens == cleared.tokens == len("a very long result")


async def test_a_turn_write_carries_stubs_for_older_messages_in_the_same_operation(
    store: Store,
) -> None:
    await append(store, user("q"), assistant("a", ["c1"]), tool("c1", "a very long result"))

    await store.append_turn(
        KEY, TurnWrite(messages=[assistant("read it")], compressed={3: "[stub of c1]", 99: "x"})
    )
    loaded = (await store.load(KEY, LoadSpec())).messages

    assert [m.compressed_content for m in loaded] == [None, None, "[stub of c1]", None]
    assert loaded[2].content == "a very long result"


async def test_a_message_can_be_stored_already_compressed(store: Store) -> None:
    stored = tool("c1", "original")
    stored.compressed_content = "stub"
    await append(store, user("q"), stored)

    loaded = (await store.load(KEY, LoadSpec())).messages[1]

    assert (loaded.content, loaded.compressed_content) == ("original", "stub")


async def test_add_summary_assigns_increasing_ids(store: Store) -> None:
    await conversation(store, 3)

    first = await store.add_summary(KEY, SummaryRecord("summary", "part one", 1, 2, tokens=5))
    second = await store.add_summary(KEY, SummaryRecord("summary", "part two", 3, 4, model="m"))

    assert first is not None and second is not None
    assert (first.id, second.id) == (1, 2)
    summaries = (await store.load(KEY, LoadSpec())).summaries
    assert [(s.id, s.text, s.from_seq, s.to_seq) for s in summaries] == [
        (1, "part one", 1, 2),
        (2, "part two", 3, 4),
    ]
    assert summaries[0].tokens == 5 and summaries[1].model == "m"
    assert summaries[0].created_at > 0
    assert (await store.load(KEY, LoadSpec())).meta.boundary_seq == 0


async def test_a_compaction_moves_the_boundary(store: Store) -> None:
    await conversation(store, 3)

    record = await store.add_summary(
        KEY, SummaryRecord("compaction", "all so far", 1, 4), expect_boundary=0
    )

    assert record is not None and record.kind == "compaction"
    assert (await store.load(KEY, LoadSpec())).meta.boundary_seq == 4


async def test_a_compaction_with_a_stale_boundary_writes_nothing(store: Store) -> None:
    await conversation(store, 3)
    await store.add_summary(KEY, SummaryRecord("compaction", "first", 1, 2), expect_boundary=0)

    late = await store.add_summary(
        KEY, SummaryRecord("compaction", "second", 1, 4), expect_boundary=0
    )

    snapshot = await store.load(KEY, LoadSpec())
    assert late is None
    assert snapshot.meta.boundary_seq == 2 and [s.text for s in snapshot.summaries] == ["first"]


async def test_two_compactions_racing_on_one_boundary_write_once(store: Store) -> None:
    await conversation(store, 3)

    results = await asyncio.gather(
        *(
            store.add_summary(KEY, SummaryRecord("compaction", f"c{i}", 1, 4), expect_boundary=0)
            for i in range(5)
        )
    )

    assert sum(r is not None for r in results) == 1
    assert len((await store.load(KEY, LoadSpec())).summaries) == 1


async def test_a_summary_of_a_missing_session_is_not_written(store: Store) -> None:
    assert await store.add_summary(KEY, SummaryRecord("summary", "x", 1, 1)) is None
    assert (await store.load(KEY, LoadSpec())).exists is False


# --- reads by seq and tool call ------------------------------------------------------------


async def test_get_messages_keeps_the_order_asked_and_skips_unknown_seqs(store: Store) -> None:
    await conversation(store, 2)

    found = await store.get_messages(KEY, [4, 1, 42, 2])

    assert [m.seq for m in found] == [4, 1, 2]
    assert await store.get_messages(KEY, []) == []


async def test_get_range_returns_active_messages_in_the_range(store: Store) -> None:
    await conversation(store, 3)
    await append(store, user("edited"), supersede_after=4)

    found = await store.get_range(KEY, 2, 7)

    assert [m.seq for m in found] == [2, 3, 4, 7]


async def test_get_range_with_a_budget_returns_the_newest_messages_that_hold_it(
    store: Store,
) -> None:
    await conversation(store, 4)  # questions hold 10 tokens, answers 8
    await append(store, user("edited"), supersede_after=6)  # seq 9 (6 tokens); 7, 8 gone

    def seqs(found: list[StoredMessage]) -> list[int]:
        return [m.seq for m in found]

    # from the end down, up to the message at which they hold the budget
    assert seqs(await store.get_range(KEY, 2, 9, budget=RangeBudget(24))) == [5, 6, 9]
    assert seqs(await store.get_range(KEY, 2, 9, budget=RangeBudget(25))) == [4, 5, 6, 9]
    assert seqs(await store.get_range(KEY, 2, 5, budget=RangeBudget(18))) == [4, 5]
    # a budget the range never holds: all of it
    assert seqs(await store.get_range(KEY, 2, 9, budget=RangeBudget(1000))) == [2, 3, 4, 5, 6, 9]
    assert await store.get_range(KEY, 2, 9, budget=RangeBudget(0)) == []
    whole = await store.get_range(KEY, 1, 9)
    assert await store.get_range(KEY, 1, 9, budget=RangeBudget(30)) == whole[-4:]


async def test_a_budget_counts_a_message_with_a_stub_as_its_stub(store: Store) -> None:
    await conversation(store, 3)  # seqs 1-6: questions hold 10 tokens, answers 8
    await store.set_compressed(KEY, {5: "[stub]"})
    sizes: list[str] = []

    def stub_size(message: StoredMessage) -> int:
        sizes.append(message.compressed_content or "")
        return 1

    found = await store.get_range(KEY, 1, 6, budget=RangeBudget(20, stub_size))

    assert [m.seq for m in found] == [3, 4, 5, 6]  # 8 + 1 + 8 + 10
    assert found[2].compressed_content == "[stub]" and sizes == ["[stub]"]
    # without a stub size, a message holds its tokens
    found = await store.get_range(KEY, 1, 6, budget=RangeBudget(20))
    assert [m.seq for m in found] == [4, 5, 6]


async def test_find_tool_result_returns_the_newest_answer(store: Store) -> None:
    await append(store, user("q"), assistant("", ["c1"]), tool("c1", "old"))
    await append(store, user("again"), assistant("", ["c1"]), tool("c1", "new"))

    found = await store.find_tool_result(KEY, "c1")

    assert found is not None and (found.content, found.seq) == ("new", 6)
    assert await store.find_tool_result(KEY, "missing") is None


async def test_find_tool_result_prefers_an_active_answer(store: Store) -> None:
    await append(store, user("q"), assistant("", ["c1"]), tool("c1", "kept"))
    await append(store, user("q2"), assistant("", ["c1"]), tool("c1", "rewound"))
    await append(store, user("edited"), supersede_after=3)

    found = await store.find_tool_result(KEY, "c1")

    assert found is not None and found.content == "kept"


async def test_find_tool_result_falls_back_to_a_superseded_answer(store: Store) -> None:
    await append(store, user("q"), assistant("", ["c1"]), tool("c1", "rewound"))
    await append(store, user("edited"), supersede_after=0)

    found = await store.find_tool_result(KEY, "c1")

    assert found is not None and (found.content, found.seq) == ("rewound", 3)


# --- sessions, agents, config ----------------------------------------------------------------


async def test_set_calibration_is_stored_in_the_meta(store: Store) -> None:
    await conversation(store, 1)

    await store.set_calibration(KEY, 1.375)

    assert (await store.load(KEY, LoadSpec())).meta.calibration == 1.375


async def test_sessions_are_isolated_by_namespace(store: Store) -> None:
    other = SessionKey("ns-2", KEY.agent, KEY.session)
    await append(store, user("mine"))
    await append(store, user("theirs"), key=other)

    assert await load(store) == ["mine"]
    assert await load(store, key=other) == ["theirs"]


async def test_ids_with_separators_never_share_a_session(store: Store) -> None:
    one, two = SessionKey("ns", "a:b", "c"), SessionKey("ns", "a", "b:c")
    await append(store, user("one"), key=one)
    await append(store, user("two"), key=two)
    await append(store, user("braces"), key=SessionKey("ns", "a}", "{b"))

    assert await load(store, key=one) == ["one"]
    assert await load(store, key=two) == ["two"]


async def test_list_agents_counts_sessions_newest_first(store: Store) -> None:
    await append(store, user("q"), key=SessionKey("ns-1", "alpha", "s1"))
    await append(store, user("q"), key=SessionKey("ns-2", "alpha", "s2"))
    await append(store, user("q"), key=SessionKey("ns-1", "beta", "s1"))
    await append(store, user("again"), key=SessionKey("ns-1", "alpha", "s1"))

    agents = await store.list_agents()

    assert [(a.agent, a.session_count) for a in agents] == [("alpha", 2), ("beta", 1)]
    assert agents[0].updated_at >= agents[1].updated_at > 0


async def test_list_sessions_spans_namespaces_newest_first(store: Store) -> None:
    await append(store, user("q"), assistant("a"), key=SessionKey("ns-1", "alpha", "old"))
    await append(store, user("q"), key=SessionKey("ns-2", "alpha", "new"))
    await append(store, user("q"), key=SessionKey("ns-1", "beta", "elsewhere"))

    sessions = await store.list_sessions("alpha")

    assert [(s.namespace, s.session, s.message_count) for s in sessions] == [
        ("ns-2", "new", 1),
        ("ns-1", "old", 2),
    ]
    assert [s.session for s in await store.list_sessions("alpha", limit=1)] == ["new"]
    assert await store.list_sessions("nobody") == []


async def test_delete_session_removes_every_record(store: Store) -> None:
    await conversation(store, 2)
    await store.add_summary(KEY, SummaryRecord("compaction", "s", 1, 2))
    await store.set_compressed(KEY, {2: "stub"})
    await store.acquire_lock(KEY, "compact", 30)
    other = SessionKey(KEY.namespace, KEY.agent, "kept")
    await append(store, user("stays"), key=other)

    assert await store.delete_session(KEY) is True

    snapshot = await store.load(KEY, LoadSpec())
    assert snapshot.exists is False and snapshot.messages == [] and snapshot.summaries == []
    assert await store.get_messages(KEY, [1, 2]) == []
    assert [s.session for s in await store.list_sessions(KEY.agent)] == ["kept"]
    assert await store.acquire_lock(KEY, "compact", 30) is not None
    assert await store.delete_session(KEY) is False
    assert await load(store, key=other) == ["stays"]


async def test_an_agent_without_sessions_is_no_longer_listed(store: Store) -> None:
    await append(store, user("q"))

    await store.delete_session(KEY)

    assert await store.list_agents() == []


async def test_agent_config_can_be_set_read_and_cleared(store: Store) -> None:
    config = {"memoryConfig": {"kind": "windowed", "maxMessages": 20}, "name": "agent-a"}

    assert await store.get_agent_config("agent-a") is None
    await store.set_agent_config("agent-a", config)
    assert await store.get_agent_config("agent-a") == config
    await store.set_agent_config("agent-a", None)
    assert await store.get_agent_config("agent-a") is None


async def test_load_returns_the_agent_config_override(store: Store) -> None:
    config = {"memoryConfig": {"kind": "full"}}
    await store.set_agent_config(KEY.agent, config)

    assert (await store.load(KEY, LoadSpec())).agent_config == config
    await append(store, user("q"))
    assert (await store.load(KEY, LoadSpec())).agent_config == config


# --- write ids ---------------------------------------------------------------------------


async def test_a_write_sent_again_with_its_id_is_stored_once(store: Store) -> None:
    await conversation(store, 1)
    write = TurnWrite([user("once"), assistant("reply")])

    first = await store.append_turn(KEY, write)
    again = await store.append_turn(KEY, write)

    assert again.seqs == first.seqs == [3, 4]
    assert again.meta.head_seq == 4
    assert await load(store) == ["question 0", "answer 0", "once", "reply"]


async def test_a_write_id_is_recognised_after_later_writes_and_concurrent_copies(
    store: Store,
) -> None:
    write = TurnWrite([user("q"), assistant("a")])
    results = await asyncio.gather(*(store.append_turn(KEY, write) for _ in range(5)))
    await append(store, user("later"))

    again = await store.append_turn(KEY, write)

    assert {tuple(r.seqs) for r in [*results, again]} == {(1, 2)}
    assert await load(store) == ["q", "a", "later"]


async def test_the_same_messages_under_a_new_write_id_are_a_new_turn(store: Store) -> None:
    await store.append_turn(KEY, TurnWrite([user("same")]))
    await store.append_turn(KEY, TurnWrite([user("same")]))

    assert await load(store) == ["same", "same"]


# --- locks and parts ---------------------------------------------------------------------------


async def test_a_lock_has_one_holder_until_released(store: Store) -> None:
    token = await store.acquire_lock(KEY, "compact", 30)

    assert token is not None
    assert await store.acquire_lock(KEY, "compact", 30) is None
    assert await store.acquire_lock(KEY, "other", 30) is not None
    await store.release_lock(KEY, "compact", token)
    assert await store.acquire_lock(KEY, "compact", 30) is not None


async def test_a_lock_expires_after_its_ttl(store: Store) -> None:
    assert await store.acquire_lock(KEY, "compact", 0.2) is not None
    assert await store.acquire_lock(KEY, "compact", 0.2) is None

    await asyncio.sleep(0.3)

    assert await store.acquire_lock(KEY, "compact", 30) is not None


async def test_a_stale_token_releases_nothing(store: Store) -> None:
    stale = await store.acquire_lock(KEY, "compact", 0.1)
    await asyncio.sleep(0.2)
    current = await store.acquire_lock(KEY, "compact", 30)
    assert stale is not None and current is not None

    await store.release_lock(KEY, "compact", stale)

    assert await store.acquire_lock(KEY, "compact", 30) is None


async def test_parts_are_stored_once_by_digest(store: Store) -> None:
    data = bytes(range(256)) + b"\n\x00tail"
    digest = hashlib.sha256(data).hexdigest()

    await store.put_part(KEY, digest, data, "image/png")
    await store.put_part(KEY, digest, data, "image/png")

    assert await store.get_part(KEY, digest) == (data, "image/png")
    assert await store.get_part(KEY, "0" * 64) is None


async def test_parts_are_written_and_read_in_batches(store: Store) -> None:
    first, second = b"\x89PNG first\n", b"%PDF-1.4 second"
    digests = ["sha256:" + hashlib.sha256(d).hexdigest() for d in (first, second)]
    await store.put_part(KEY, digests[0], first, "image/png")

    await store.put_parts(KEY, [(digests[0], b"ignored: already stored", "image/png"),
                                (digests[1], second, "application/pdf"),
                                (digests[1], second, "application/pdf")])
    await store.put_parts(KEY, [])

    assert await store.get_parts(KEY, [*digests, "sha256:" + "0" * 64]) == {
        digests[0]: (first, "image/png"),
        digests[1]: (second, "application/pdf"),
    }
    assert await store.get_parts(KEY, []) == {}


@pytest.mark.parametrize("other", [
    pytest.param(SessionKey("ns-2", KEY.agent, KEY.session), id="another-namespace"),
    pytest.param(SessionKey(KEY.namespace, KEY.agent, "session-2"), id="another-session"),
    pytest.param(SessionKey(KEY.namespace, "agent-b", KEY.session), id="another-agent"),
])
async def test_a_part_is_readable_only_under_the_session_that_stored_it(
    store: Store, other: SessionKey
) -> None:
    data = b"\x89PNG tenant one's image"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    await append(store, user("look"))
    await store.put_parts(KEY, [(digest, data, "image/png")])

    assert await store.get_parts(other, [digest]) == {}
    assert await store.get_part(other, digest) is None
    # the same bytes sent in the other session are its own copy
    await store.put_parts(other, [(digest, data, "image/png")])
    await store.delete_session(other)
    assert await store.get_parts(other, [digest]) == {}
    assert await store.get_parts(KEY, [digest]) == {digest: (data, "image/png")}


async def test_deleting_a_session_reclaims_its_parts(store: Store) -> None:
    data = b"%PDF-1.4 a report"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    await append(store, user("read this"))
    await store.put_parts(KEY, [(digest, data, "application/pdf")])

    assert await store.delete_session(KEY) is True

    assert await store.get_parts(KEY, [digest]) == {}


async def test_ping_answers(store: Store) -> None:
    assert await store.ping() is True


# --- a random walk against a model of the log ----------------------------------------------------


async def test_random_turns_and_rewinds_match_a_model_of_the_log(store: Store) -> None:
    rng = random.Random(20240501)
    active: list[StoredMessage] = []  # the model: the active log, in order
    for step in range(60):
        new = [user(f"q{step}")] + [assistant(f"a{step}.{i}") for i in range(rng.randint(0, 3))]
        rewind = rng.random() < 0.3 and len(active) > 0
        after = rng.randint(0, len(active) - 1) if rewind else None
        write = TurnWrite(new)
        if rewind:
            assert after is not None
            write.supersede_after = active[after - 1].seq if after else 0
            active = active[:after]
        result = await store.append_turn(KEY, write)
        for seq, stored in zip(result.seqs, new, strict=True):
            stored.seq = seq
        active += new

        probe = chains(active)
        snapshot = await store.load(KEY, LoadSpec(limit=5), probe=probe)
        assert [m.content for m in snapshot.messages] == [m.content for m in active[-5:]]
        assert [m.chain for m in snapshot.messages] == probe[-5:]
        assert (snapshot.matched, snapshot.matched_seq) == (len(active), active[-1].seq)
        assert snapshot.meta.active_count == len(active)
        last_user = max(m.seq for m in active if m.role == "user")
        assert snapshot.meta.last_user_seq == last_user


# --- Redis only --------------------------------------------------------------------------------

INDEX_PREFIXES = (b"mp:agents", b"mp:agent:", b"mp:agentcfg:", b"mp:ns:")


async def all_keys(client: Redis) -> list[bytes]:
    return [k async for k in client.scan_iter(match="*", count=1000)]


async def test_every_redis_key_of_a_session_carries_its_hash_tag(
    redis_store: RedisStore, redis_client: Redis
) -> None:
    await append(redis_store, user("q"), assistant("", ["c1"]), tool("c1", "r"))
    await redis_store.set_compressed(KEY, {3: "stub"})
    await redis_store.add_summary(KEY, SummaryRecord("compaction", "s", 1, 2))
    await redis_store.acquire_lock(KEY, "compact", 30)
    await redis_store.set_agent_config(KEY.agent, {"name": KEY.agent})
    await redis_store.put_part(KEY, "d1", b"bytes", "image/png")

    keys = await all_keys(redis_client)
    session_keys = [k for k in keys if not k.startswith(INDEX_PREFIXES)]

    assert len(session_keys) >= 7
    assert all(KEY.tag.encode() in k for k in session_keys)
    assert len({key_slot(k) for k in session_keys}) == 1


async def test_deleting_a_redis_session_leaves_no_key_behind(
    redis_store: RedisStore, redis_client: Redis
) -> None:
    await append(redis_store, user("q"), assistant("", ["c1"]), tool("c1", "r"))
    await redis_store.set_compressed(KEY, {3: "stub"})
    await redis_store.add_summary(KEY, SummaryRecord("compaction", "s", 1, 2))
    await redis_store.acquire_lock(KEY, "compact", 30)
    await redis_store.put_part(KEY, "sha256:d1", b"bytes", "image/png")

    await redis_store.delete_session(KEY)

    assert [k for k in await all_keys(redis_client) if KEY.tag.encode() in k] == []
    assert await redis_client.zcard(f"mp:agent:{KEY.agent}:sessions") == 0


async def test_redis_load_and_append_cost_one_round_trip_whatever_the_history_length(
    redis_store: RedisStore, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[Any] = []
    send = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        writes.append(command)
        await send(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    for length in (10, 1000):
        key = SessionKey("ns", "agent", f"history-{length}")
        history = [message("user" if i % 2 else "assistant", f"m{i}") for i in range(length)]
        await redis_store.append_turn(key, TurnWrite(history))  # also warms the connection
        await redis_client.config_resetstat()

        writes.clear()
        snapshot = await redis_store.load(key, LoadSpec(limit=500), probe=chains(history))
        load_trips = len(writes)
        writes.clear()
        await redis_store.append_turn(key, TurnWrite([user("next"), assistant("reply")]))
        append_trips = len(writes)

        assert (load_trips, append_trips) == (1, 1), f"history of {length}"
        assert len(snapshot.messages) == min(length, 500) and snapshot.matched == length
        stats = await redis_client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 2
        assert "cmdstat_script|exists" not in stats and "cmdstat_eval" not in stats


async def test_redis_scripts_are_reloaded_after_the_script_cache_is_flushed(
    redis_store: RedisStore, redis_client: Redis
) -> None:
    await append(redis_store, user("before"))

    await redis_client.script_flush()
    await append(redis_store, assistant("after"))

    assert await load(redis_store) == ["before", "after"]


async def test_a_redis_store_without_a_server_starts_and_reports_it_unavailable() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0")
    await store.open()
    try:
        assert await store.ping() is False
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.load(KEY, LoadSpec())
        with pytest.raises(StoreUnavailable):
            await store.append_turn(KEY, TurnWrite([user("q")]))
        assert time.monotonic() - started < 2
    finally:
        await store.close()


@pytest.mark.skipif(not redis_server_available(), reason="redis-server is not installed")
async def test_a_stalled_redis_fails_a_request_within_the_socket_timeout() -> None:
    with RedisServer() as server:
        store = RedisStore(server.url)
        await store.open()
        await append(store, user("q"))
        server.kill(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.load(KEY, LoadSpec())
            assert time.monotonic() - started < SOCKET_TIMEOUT + 0.5
        finally:
            server.kill(signal.SIGCONT)
        assert await load(store) == ["q"]
        await store.close()


# --- SQLite only -------------------------------------------------------------------------------


async def test_sqlite_data_survives_close_and_reopen(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/nested/dir/store.db"
    store = SqliteStore(url)
    await store.open()
    await append(store, user("q"), assistant("a"))
    await store.add_summary(KEY, SummaryRecord("compaction", "s", 1, 1))
    await store.close()

    reopened = SqliteStore(url)
    await reopened.open()
    snapshot = await reopened.load(KEY, LoadSpec(since="boundary"))
    await reopened.close()

    assert [m.content for m in snapshot.messages] == ["a"]
    assert snapshot.meta.head_seq == 2 and snapshot.summaries[0].text == "s"


async def test_a_sqlite_store_on_an_unusable_path_fails_to_open(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    store = SqliteStore(f"sqlite:///{tmp_path}/file/store.db")

    with pytest.raises((StoreUnavailable, OSError)):
        await store.open()
    assert await store.ping() is False


async def test_sqlite_runs_in_wal_mode(sqlite_store: SqliteStore) -> None:
    with sqlite3.connect(sqlite_store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


CRASHING_WRITER = """
import asyncio, os, signal, sys
from storage.sqlite import SqliteStore
from strategies.records import SessionKey, StoredMessage, TurnWrite

async def main() -> None:
    store = SqliteStore(sys.argv[1])
    await store.open()
    key = SessionKey(*sys.argv[2:5])
    await store.append_turn(key, TurnWrite([StoredMessage(role="user", content="acked")]))
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


async def test_an_acknowledged_sqlite_turn_survives_kill_9(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    writer = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHING_WRITER, url, KEY.namespace, KEY.agent, KEY.session
    )
    assert await writer.wait() == -signal.SIGKILL

    store = SqliteStore(url)
    await store.open()
    assert await load(store) == ["acked"]
    await store.close()


async def test_find_sessions_is_exact_whatever_the_agent_has(store: Store) -> None:
    await append(store, user("q"), assistant("a"), key=SessionKey("ns-1", "alpha", "s-0"))
    await append(store, user("q"), key=SessionKey("ns-2", "alpha", "s-0"))
    await append(store, user("q"), key=SessionKey("ns-1", "alpha", "s-00"))
    await append(store, user("q"), key=SessionKey("ns-1", "beta", "s-0"))
    await append(store, user("q"), key=SessionKey("ns-1", "alpha", "s*[0]?"))

    found = await store.find_sessions("alpha", "s-0")

    assert [(s.namespace, s.session, s.message_count) for s in found] == [
        ("ns-2", "s-0", 1), ("ns-1", "s-0", 2)]
    assert [s.namespace for s in await store.find_sessions("alpha", "s*[0]?")] == ["ns-1"]
    assert await store.find_sessions("alpha", "s-") == []
    assert await store.find_sessions("nobody", "s-0") == []
    await store.delete_session(SessionKey("ns-2", "alpha", "s-0"))
    assert [s.namespace for s in await store.find_sessions("alpha", "s-0")] == ["ns-1"]


async def test_count_sessions_counts_one_namespace_across_agents(store: Store) -> None:
    await append(store, user("q"), key=SessionKey("ns-1", "alpha", "s1"))
    await append(store, user("q"), key=SessionKey("ns-1", "beta", "s1"))
    await append(store, user("again"), key=SessionKey("ns-1", "alpha", "s1"))
    await append(store, user("q"), key=SessionKey("ns-2", "alpha", "s2"))

    assert await store.count_sessions("ns-1") == 2
    assert await store.count_sessions("ns-2") == 1
    assert await store.count_sessions("nobody") == 0
    await store.delete_session(SessionKey("ns-1", "beta", "s1"))
    assert await store.count_sessions("ns-1") == 1
