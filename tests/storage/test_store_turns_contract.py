"""The Store contract, a session's log of turns: what an append stores and a load returns,
the probe a resent history is matched by, rewinds, concurrent writers, write ids sent again,
and a random walk against a model of the log. Every test runs against every backend (see
``conftest.store``); the helpers are in ``contract_support.py``.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from contract_support import KEY, append, assistant, chains, conversation, load, message, tool, user

from storage.base import Store
from strategies.records import LoadSpec, StoredMessage, TurnWrite, chain_hash

# --- appends and loads -------------------------------------------------------------------


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


# --- a random walk against a model of the log --------------------------------------------


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
