"""The session cache: turns after the first reuse the decoded session, and what they send
and store is exactly what a proxy without the cache sends and stores."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import pytest
from e2e import RunningProxy, write_agent
from summarizing_support import MODEL, sized

from proxy.testing.fake_upstream import Reply
from proxy.turn.session_cache import SessionCache, estimated_bytes, key_bytes
from strategies.records import (
    LoadSpec,
    SessionKey,
    SessionSnapshot,
    StoredMessage,
    TurnWrite,
)

LOOKUP = {"name": "lookup", "description": "Look a thing up.",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


def conversation(proxy: RunningProxy, fake, session: str, *, agent: str = "cached") -> None:
    """Text turns, tool round trips with results large enough to be compressed, a streamed
    turn: every kind of write a turn makes."""
    client = proxy.client(agent, session)
    tools = [{"type": "function", "function": LOOKUP}]
    fake.queue(Reply.text("first answer"))
    client.chat.completions.create(model=MODEL, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "one"}])
    for n in range(5):
        fake.queue(Reply.tool_calls([{"id": f"call_{n}", "name": "lookup",
                                      "arguments": {"q": str(n)}}]))
        client.chat.completions.create(model=MODEL, tools=tools,
                                       messages=[{"role": "user", "content": f"look {n} up"}])
        fake.queue(Reply.text(f"found {n}"))
        client.chat.completions.create(model=MODEL, tools=tools, messages=[
            {"role": "tool", "tool_call_id": f"call_{n}", "content": sized(f"r{n}", 700)}])
    fake.queue(Reply.text("streamed answer"))
    stream = client.chat.completions.create(
        model=MODEL, stream=True, messages=[{"role": "user", "content": "and y?"}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    fake.queue(Reply.text("last answer"))
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "thanks"}])
    proxy.drain()


def sent(fake, start: int = 0) -> list[list[dict]]:
    return [json.loads(json.dumps(r.body["messages"])) for r in fake.chat_requests[start:]]


def cached_entries(proxy: RunningProxy) -> list[tuple[SessionKey, LoadSpec, object]]:
    cache = proxy.services.sessions
    return [
        (SessionKey(ns, agent, session), LoadSpec(limit, since, fill), entry)  # type: ignore[arg-type]
        for (ns, agent, session, limit, since, fill), entry in cache._entries.items()
    ]


@pytest.mark.parametrize("fetch", [500, 5])
def test_a_cached_session_is_what_a_fresh_load_returns(make_proxy, fake, agents_dir, fetch):
    write_agent(agents_dir, "cached", llm={"model": MODEL, "contextWindow": 4000},
                memoryConfig={"kind": "summarizing_window", "maxHistoryFetch": fetch})
    proxy = make_proxy()
    conversation(proxy, fake, "s1")

    entries = cached_entries(proxy)
    assert entries, "the session was not cached"
    for key, spec, entry in entries:
        # a paged spec's entry holds the pages its window's budget needed: the same tail
        # read at once
        whole = LoadSpec(max(spec.limit, len(entry.messages)), spec.since)
        fresh: SessionSnapshot = proxy.call(proxy.services.store.load(key, whole))
        assert entry.version == fresh.meta.version
        assert list(entry.messages) == fresh.messages
        assert list(entry.summaries) == fresh.summaries
    # the size kept up turn by turn is the estimate of what is held
    assert all(entry.size == estimated_bytes(entry.messages) for _, _, entry in entries)
    assert proxy.services.sessions.size == sum(
        entry.size + key_bytes(key, spec) for key, spec, entry in entries)
    if fetch < 500:
        # more than one page: what the budget holds
        assert all(len(entry.messages) > fetch for _, _, entry in entries)
        return
    # the large tool result was compressed, and the cached copy knows it
    assert any(m.compressed_content for _, _, e in entries for m in e.messages)


def test_turns_after_the_first_are_served_from_the_cache(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "cached", llm={"model": MODEL, "contextWindow": 4000})
    proxy = make_proxy()
    conversation(proxy, fake, "s1")

    cache = proxy.services.sessions
    # 13 turns: the first finds the session missing and creates it (its write is cached),
    # every later turn reads only the head
    assert (cache.misses, cache.hits, cache.catch_ups) == (1, 12, 0)
    metrics = httpx.get(f"{proxy.base}/metrics").text
    assert "memory_proxy_session_cache_hits_total 12\n" in metrics
    assert "memory_proxy_session_cache_catch_ups_total 0\n" in metrics
    assert "memory_proxy_session_cache_misses_total 1\n" in metrics
    assert "memory_proxy_session_cache_sessions 1\n" in metrics


def test_with_and_without_the_cache_the_upstream_sees_the_same_windows(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "cached", llm={"model": MODEL, "contextWindow": 4000})
    cached = make_proxy()
    conversation(cached, fake, "with")
    with_cache = sent(fake)
    uncached = make_proxy(session_cache_mb=0)
    conversation(uncached, fake, "without")

    assert uncached.services.sessions.hits == 0
    assert sent(fake, len(with_cache)) == with_cache
    with_rows = [(m.role, m.content, m.compressed_content) for m in cached.stored("cached", "with")]
    without_rows = [
        (m.role, m.content, m.compressed_content) for m in uncached.stored("cached", "without")
    ]
    assert with_rows == without_rows


def test_a_write_by_another_replica_is_seen_on_the_next_turn(make_proxy, fake):
    first, second = make_proxy(), make_proxy()
    one, two = first.client("shared", "s1"), second.client("shared", "s1")
    fake.queue(Reply.text("a1"), Reply.text("a2"), Reply.text("a3"))
    one.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q1"}])
    two.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q2"}])
    one.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q3"}])

    assert [m["content"] for m in sent(fake)[-1]] == ["q1", "a1", "q2", "a2", "q3"]


def test_a_write_straight_to_the_store_is_seen_on_the_next_turn(proxy, fake):
    client = proxy.client("direct", "s1")
    fake.queue(Reply.text("a1"), Reply.text("a2"))
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q1"}])
    key = proxy.key("direct", "s1")
    proxy.call(proxy.services.store.set_compressed(key, {2: "[answer elided]"}))

    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q2"}])

    assert [m["content"] for m in sent(fake)[-1]] == ["q1", "[answer elided]", "q2"]
    # stubs are more than an append: the session is read whole, not caught up
    assert (proxy.services.sessions.misses, proxy.services.sessions.catch_ups) == (2, 0)


@pytest.mark.parametrize("replicas", [1, 2])
def test_concurrent_turns_of_one_session_lose_nothing(make_proxy, fake, replicas):
    proxies = [make_proxy() for _ in range(replicas)]

    async def turns() -> None:
        import openai

        clients = [
            openai.AsyncOpenAI(base_url=proxy.url("busy", "s1"), api_key="sk-test-busy",
                               max_retries=0, timeout=20)
            for proxy in proxies
        ]  # fmt: skip
        for burst in range(3):
            await asyncio.gather(*(
                clients[i % replicas].chat.completions.create(
                    model="gpt-4o-mini",
                    messages=[{"role": "user", "content": f"q{burst}.{i}"}])
                for i in range(8)
            ))  # fmt: skip
        for client in clients:
            await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "last"}])
            await client.close()

    asyncio.run(turns())

    asked = [f"q{burst}.{i}" for burst in range(3) for i in range(8)]
    last = sent(fake)[-1]
    assert sorted(m["content"] for m in last if m["role"] == "user") == sorted(
        [*asked, *["last"] * replicas]
    )
    assert len(last) == 2 * (24 + replicas) - 1
    # what each replica holds is what the store holds at the version it holds
    stored = proxies[0].stored("busy", "s1", api_key="sk-test-busy")
    for proxy in proxies:
        entries = [entry for *_, entry in cached_entries(proxy)]
        assert entries
        for entry in entries:
            assert list(entry.messages) == [m for m in stored if m.seq <= entry.head_seq]


def record(seq: int, text: str = "x") -> StoredMessage:
    fp = hashlib.sha1(text.encode()).hexdigest()
    return StoredMessage(role="user", content=text, fingerprint=fp, seq=seq)


def snapshot(version: int, count: int) -> SessionSnapshot:
    from strategies.records import SessionMeta

    return SessionSnapshot(SessionMeta(head_seq=count, version=version),
                           [record(i + 1) for i in range(count)], [], exists=True)


def test_the_cache_holds_at_most_its_bound_dropping_the_least_recent():
    spec = LoadSpec(limit=500)
    keys = [SessionKey("ns", "a", f"s{i}") for i in range(3)]
    four = estimated_bytes(tuple(snapshot(1, 4).messages)) + key_bytes(keys[0], spec)
    cache = SessionCache(max_bytes=2 * four + 1)
    for key in keys:
        cache.fill(key, spec, snapshot(1, 4))
        assert cache.size <= cache.max_bytes
    assert cache.known(keys[0], spec) is None
    assert cache.known(keys[1], spec).version == 1
    assert cache.known(keys[2], spec).version == 1
    assert cache.size == 2 * four


def test_a_session_larger_than_the_bound_is_not_cached():
    cache = SessionCache(max_bytes=estimated_bytes(tuple(snapshot(1, 4).messages)) - 1)
    key, spec = SessionKey("ns", "a", "s"), LoadSpec(limit=500)
    cache.fill(key, spec, snapshot(1, 4))
    assert cache.known(key, spec) is None and cache.size == 0


def test_the_size_estimate_is_close_to_what_cached_messages_take():
    import tracemalloc

    from storage.codec import message_from_body

    text = "A sentence of ordinary prose, about the length of a short chat message. " * 3
    tokens = 48
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    messages = tuple(
        message_from_body({"role": "user", "content": text + str(i), "tokens": tokens,
                           "fingerprint": f"{i:040x}", "created_at": 1.0},
                          i, f"{i:040x}", None)
        for i in range(2000)
    )  # fmt: skip
    taken = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    estimate = estimated_bytes(messages)
    assert 0.6 * taken <= estimate <= 1.5 * taken


def test_an_append_after_another_write_is_not_applied_to_the_cache():
    cache = SessionCache(max_bytes=1 << 20)
    key, spec = SessionKey("ns", "a", "s"), LoadSpec(limit=500)
    loaded = snapshot(5, 2)
    cache.fill(key, spec, loaded)
    cache.after_append(key, spec, loaded, [record(4, "late")], None, 7, "irrelevant")
    assert cache.known(key, spec).version == 5


def test_after_append_accounts_for_every_field_of_a_turn_write():
    # a TurnWrite field added later may change what a write does to the cached session:
    # SessionCache.after_append must be reviewed with it
    assert set(TurnWrite.__dataclass_fields__) == {
        "messages", "supersede_after", "supersede_until", "system_prompt", "system_tokens",
        "model", "calibration", "compressed", "write_id",
    }


def chained(records: list[StoredMessage], previous: str = "") -> list[StoredMessage]:
    """``records`` with the chains a store gives them, continuing from ``previous``."""
    for item in records:
        previous = item.chain = hashlib.sha1((previous + item.fingerprint).encode()).hexdigest()
    return records


def grown(version: int, head: int, new: list[StoredMessage]) -> SessionSnapshot:
    from strategies.records import SessionMeta

    meta = SessionMeta(head_seq=head, version=version, head_chain=new[-1].chain)
    return SessionSnapshot(meta, new, [], exists=True, grown=True)


def held_page(cache: SessionCache, key: SessionKey, spec: LoadSpec) -> SessionSnapshot:
    """Four chained messages at version 3, cached."""
    held = snapshot(3, 4)
    chained(held.messages)
    cache.fill(key, spec, held)
    return held


def test_a_grown_snapshot_is_appended_to_the_page_held():
    cache = SessionCache(max_bytes=1 << 20)
    key, spec = SessionKey("ns", "a", "s"), LoadSpec(limit=5)
    held = held_page(cache, key, spec)
    known = cache.known(key, spec)
    new = chained([record(5, "five"), record(6, "six")], held.messages[-1].chain)

    caught_up = grown(4, 6, new)
    assert cache.fill(key, spec, caught_up, known)

    assert [m.seq for m in caught_up.messages] == [2, 3, 4, 5, 6]  # the limit: the newest 5
    assert not caught_up.grown and cache.catch_ups == 1 and cache.misses == 1
    entry = cache.known(key, spec)
    assert (entry.version, entry.head_seq) == (4, 6)
    assert list(entry.messages) == caught_up.messages
    assert entry.size == estimated_bytes(entry.messages)
    assert cache.size == entry.size + key_bytes(key, spec)


def test_a_grown_snapshot_is_refused_when_the_page_held_changed_or_does_not_lead_to_it():
    cache = SessionCache(max_bytes=1 << 20)
    key, spec = SessionKey("ns", "a", "s"), LoadSpec(limit=500)
    held = held_page(cache, key, spec)
    known = cache.known(key, spec)
    new = chained([record(5, "five")], held.messages[-1].chain)

    # another turn of this process replaced the page meanwhile
    cache.fill(key, spec, snapshot(4, 4))
    assert not cache.fill(key, spec, grown(5, 5, new), known)
    # the page left the cache
    cache.drop_session(key)
    assert not cache.fill(key, spec, grown(5, 5, new), known)
    # the messages read do not continue the page's chain
    cache.fill(key, spec, held)
    known = cache.known(key, spec)
    assert not cache.fill(key, spec, grown(5, 5, chained([record(5, "five")], "elsewhere")), known)
    assert cache.known(key, spec) is None and cache.catch_ups == 0


def test_turns_alternating_between_replicas_read_only_what_the_other_appended(make_proxy, fake):
    first, second = make_proxy(), make_proxy()
    clients = [first.client("shared", "s1"), second.client("shared", "s1")]
    for n in range(6):
        fake.queue(Reply.text(f"a{n}"))
        clients[n % 2].chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"q{n}"}])

    windows = [[m["content"] for m in window] for window in sent(fake)]
    assert windows == [
        [text for i in range(n) for text in (f"q{i}", f"a{i}")] + [f"q{n}"] for n in range(6)
    ]
    # the first replica found the session missing and created it, the second read it whole
    # on its first turn; every later turn caught up
    counts = [(p.services.sessions.misses, p.services.sessions.catch_ups) for p in (first, second)]
    assert counts == [(1, 2), (1, 2)]
    assert first.services.sessions.hits == second.services.sessions.hits == 0
    for proxy in (first, second):
        cached = [entry for *_, entry in cached_entries(proxy)]
        assert len(cached) == 1
        assert [m.content for m in cached[0].messages][-2:] in (["q4", "a4"], ["q5", "a5"])
    key = first.key("shared", "s1")
    stored = first.call(first.services.store.load(key, LoadSpec()))
    latest = max((first, second), key=lambda p: cached_entries(p)[0][2].version)
    assert list(cached_entries(latest)[0][2].messages) == stored.messages

