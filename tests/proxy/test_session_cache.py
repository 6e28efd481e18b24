"""The session cache (storage/cached.py, in front of the store of every proxy): turns
after the first reuse the decoded session, and what they send and store is exactly what a
proxy without the cache sends and stores, whoever else writes to the session."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from e2e import RunningProxy, write_agent
from summarizing_support import MODEL, sized

from proxy.testing.fake_upstream import Reply
from storage.cached import CachedStore, estimated_bytes
from strategies.records import LoadSpec

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


def metric(proxy: RunningProxy, name: str) -> float:
    for line in httpx.get(f"{proxy.base}/metrics").text.splitlines():
        if line.startswith(f"memory_proxy_session_cache_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def cache_of(proxy: RunningProxy) -> CachedStore:
    store = proxy.services.store
    assert isinstance(store, CachedStore)
    return store


@pytest.mark.parametrize("fetch", [500, 5])
def test_a_cached_session_is_what_a_fresh_load_returns(make_proxy, fake, agents_dir, fetch):
    write_agent(agents_dir, "cached", llm={"model": MODEL, "contextWindow": 4000},
                memoryConfig={"kind": "summarizing_window", "maxHistoryFetch": fetch})
    proxy = make_proxy()
    conversation(proxy, fake, "s1")

    key, spec = proxy.key("cached", "s1"), LoadSpec(limit=fetch, fill_ratio=0.5)
    cache = cache_of(proxy)
    proxy.call(cache.load(key, spec))  # cached now, if it was not
    hits = metric(proxy, "hits_total")
    through = proxy.call(cache.load(key, spec))
    fresh = proxy.call(cache.store.load(key, spec))
    assert metric(proxy, "hits_total") == hits + 1
    assert through.messages == fresh.messages and through.summaries == fresh.summaries
    assert through.meta == fresh.meta
    if fetch == 500:
        # the large tool result was compressed, and the cached page knows it
        assert any(m.compressed_content for m in through.messages)


def test_turns_after_the_first_are_served_from_the_cache(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "cached", llm={"model": MODEL, "contextWindow": 4000})
    proxy = make_proxy()
    conversation(proxy, fake, "s1")

    # 13 turns: the first finds the session missing and creates it, the second reads it;
    # every later turn reads only the head
    assert metric(proxy, "misses_total") == 2
    assert metric(proxy, "hits_total") == 11
    assert metric(proxy, "sessions") == 1
    assert 0 < metric(proxy, "bytes") <= 16 << 20


def test_with_and_without_the_cache_the_upstream_sees_the_same_windows(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "cached", llm={"model": MODEL, "contextWindow": 4000})
    cached = make_proxy()
    conversation(cached, fake, "with")
    with_cache = sent(fake)
    uncached = make_proxy(session_cache_mb=0)
    conversation(uncached, fake, "without")

    assert metric(uncached, "hits_total") == 0 and metric(uncached, "sessions") == 0
    assert sent(fake, len(with_cache)) == with_cache
    with_rows = [(m.role, m.content, m.compressed_content) for m in cached.stored("cached", "with")]
    without_rows = [
        (m.role, m.content, m.compressed_content) for m in uncached.stored("cached", "without")
    ]
    assert with_rows == without_rows


def test_a_write_by_another_replica_is_seen_on_the_next_turn(make_proxy, fake):
    first, second = make_proxy(), make_proxy()
    one, two = first.client("shared", "s1"), second.client("shared", "s1")
    fake.queue(Reply.text("a1"), Reply.text("a2"), Reply.text("a3"), Reply.text("a4"))
    one.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q1"}])
    one.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q2"}])
    two.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q3"}])
    one.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q4"}])

    assert [m["content"] for m in sent(fake)[-1]] == ["q1", "a1", "q2", "a2", "q3", "a3", "q4"]


def test_a_write_straight_to_the_store_is_seen_on_the_next_turn(proxy, fake):
    client = proxy.client("direct", "s1")
    fake.queue(Reply.text("a1"), Reply.text("a2"), Reply.text("a3"))
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q1"}])
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q2"}])
    key = proxy.key("direct", "s1")
    # behind the cache's back, as another process would
    proxy.call(cache_of(proxy).store.set_compressed(key, {2: "[answer elided]"}))

    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q3"}])

    assert [m["content"] for m in sent(fake)[-1]] == ["q1", "[answer elided]", "q2", "a2", "q3"]


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
    # what each replica's cache serves is what the store holds
    key = proxies[0].key("busy", "s1", api_key="sk-test-busy")
    spec = LoadSpec(limit=500)
    for proxy in proxies:
        cache = cache_of(proxy)
        through = proxy.call(cache.load(key, spec))
        assert through.messages == proxy.call(cache.store.load(key, spec)).messages


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
