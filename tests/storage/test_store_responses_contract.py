"""The Store contract for Responses API response ids (every backend, see ``conftest.store``):
stored with the turn's one append, found by id in their session only, forgotten on demand
and with the session."""

from __future__ import annotations

from contract_support import KEY, assistant, user

from storage.base import Store
from strategies.records import SessionKey, TurnWrite


async def turn(store: Store, response_id: str | None, *texts: str, key: SessionKey = KEY,
               **write: object) -> list[int]:
    messages = [(user if i % 2 == 0 else assistant)(t) for i, t in enumerate(texts)]
    result = await store.append_turn(
        key, TurnWrite(messages, response_id=response_id, **write)  # type: ignore[arg-type]
    )
    return result.seqs


async def test_a_response_id_names_the_seqs_of_the_write_that_stored_it(store: Store) -> None:
    await turn(store, "resp_1", "hello", "hi")
    seqs = await turn(store, "resp_2", "and then?", "then this")
    first = await store.find_response(KEY, "resp_1")
    second = await store.find_response(KEY, "resp_2")
    assert first is not None and (first.first_seq, first.seq) == (1, 2)
    assert second is not None and (second.first_seq, second.seq) == (seqs[0], seqs[-1])
    assert second.created_at > 0


async def test_an_unknown_response_or_one_of_another_session_is_not_found(store: Store) -> None:
    await turn(store, "resp_1", "hello", "hi")
    assert await store.find_response(KEY, "resp_other") is None
    other = SessionKey("ns-2", KEY.agent, KEY.session)  # another API key, the same names
    assert await store.find_response(other, "resp_1") is None
    assert await store.find_response(SessionKey("ns-1", "agent-a", "nope"), "resp_1") is None


async def test_a_write_without_a_response_id_stores_none(store: Store) -> None:
    await turn(store, None, "hello", "hi")
    assert await store.find_response(KEY, "") is None


async def test_a_response_is_found_after_a_rewind_superseded_its_messages(store: Store) -> None:
    await turn(store, "resp_1", "hello", "hi")
    await turn(store, "resp_2", "more", "sure")
    await turn(store, "resp_3", "instead", "ok", supersede_after=2)
    ref = await store.find_response(KEY, "resp_2")
    assert ref is not None and (ref.first_seq, ref.seq) == (3, 4)
    kept = await store.get_messages(KEY, [3, 4])
    assert [m.content for m in kept] == ["more", "sure"]


async def test_a_forgotten_response_is_not_found_and_its_messages_stay(store: Store) -> None:
    await turn(store, "resp_1", "hello", "hi")
    assert await store.forget_response(KEY, "resp_1") is True
    assert await store.forget_response(KEY, "resp_1") is False
    assert await store.find_response(KEY, "resp_1") is None
    assert [m.content for m in await store.get_messages(KEY, [1, 2])] == ["hello", "hi"]


async def test_responses_go_with_their_session(store: Store) -> None:
    await turn(store, "resp_1", "hello", "hi")
    await store.delete_session(KEY)
    assert await store.find_response(KEY, "resp_1") is None
    await turn(store, "resp_2", "again", "yes")
    assert await store.find_response(KEY, "resp_1") is None
