"""The Store contract, sessions and what is kept beside their logs: sessions kept apart by
their key, listed, found by name, counted and deleted; a session's calibration and an agent's
config; locks; media parts, stored per session and reclaimed with it. Every test runs against
every backend (see ``conftest.store``); the helpers are in ``contract_support.py``.
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from contract_support import KEY, append, assistant, conversation, load, user

from storage.base import Store
from strategies.records import LoadSpec, SessionKey, SummaryRecord

# --- sessions and agents -----------------------------------------------------------------


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


# --- calibration and agent config --------------------------------------------------------


async def test_set_calibration_is_stored_in_the_meta(store: Store) -> None:
    await conversation(store, 1)

    await store.set_calibration(KEY, 1.375)

    assert (await store.load(KEY, LoadSpec())).meta.calibration == 1.375


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


# --- locks and parts ---------------------------------------------------------------------


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
