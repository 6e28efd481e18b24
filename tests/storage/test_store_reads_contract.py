"""The Store contract, a log read back: a load's window (the newest messages up to its
limit, from the compaction boundary or the latest turn), messages by seq, ranges walked within
a budget, tool results by call id, and the stubs and summaries that stand in for messages when
they are read. Every test runs against every backend (see ``conftest.store``); the helpers are
in ``contract_support.py``.
"""

from __future__ import annotations

import asyncio

from contract_support import KEY, append, assistant, conversation, load, tool, user

from storage.base import Store
from strategies.records import LoadSpec, RangeBudget, StoredMessage, SummaryRecord, TurnWrite

# --- load windows ------------------------------------------------------------------------


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


# --- reads by seq and tool call ----------------------------------------------------------


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


# --- compression and summaries -----------------------------------------------------------


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
