"""``previous_response_id`` keeps OpenAI's meaning: the context is that response's chain.
Continuing from an earlier response forks there (the turns after it are superseded in the
session log, kept, never sent); continuing from a response on the abandoned branch brings
its chain back."""

from __future__ import annotations

import json
from typing import Any

from proxy.testing.fake_upstream import FakeUpstream

MODEL = "gpt-4o"


def last_sent(fake: FakeUpstream) -> str:
    body = [r for r in fake.requests if r.method == "POST"][-1].body
    return json.dumps(body.get("input") if "input" in body else body.get("messages"))


def ask(client: Any, text: str, previous: Any = None) -> Any:
    return client.responses.create(
        model=MODEL, input=text, previous_response_id=previous.id if previous else None
    )


def test_a_fork_from_an_earlier_response_does_not_carry_the_turns_after_it(proxy, fake):
    client = proxy.client("assistant", "fork")
    first = ask(client, "My name is Ann.")
    second = ask(client, "I like green tea.", first)
    ask(client, "What do I like?", first)
    sent = last_sent(fake)
    assert "My name is Ann." in sent and "green tea" not in sent

    ask(client, "And what is my name?", second)  # back on the abandoned branch
    sent = last_sent(fake)
    assert "My name is Ann." in sent and "I like green tea." in sent
    assert "What do I like?" not in sent
    # every response stays retrievable
    assert client.responses.retrieve(second.id).output_text.startswith("ok")

    stored = proxy.stored("assistant", "fork")  # the active log: the branch now followed
    assert [m.content for m in stored if m.role == "user"] == [
        "My name is Ann.", "I like green tea.", "And what is my name?"]
    snapshot = proxy.snapshot("assistant", "fork")
    assert snapshot.meta.head_seq == 10  # 4 writes of 2, then the branch's copy of 2


def test_continuing_from_the_latest_response_appends(proxy, fake):
    client = proxy.client("assistant", "line")
    first = ask(client, "One.")
    second = ask(client, "Two.", first)
    ask(client, "Three.", second)
    assert [m.content for m in proxy.stored("assistant", "line") if m.role == "user"] == [
        "One.", "Two.", "Three."]
    assert proxy.snapshot("assistant", "line").meta.head_seq == 6


def test_a_chain_with_a_fork_on_the_redis_store(make_proxy, fake, redis_server):
    from redis_server import flush_redis

    flush_redis(redis_server.url)
    proxy = make_proxy(store_url=str(redis_server.url))
    client = proxy.client("assistant", "fork-redis")
    first = ask(client, "My name is Ann.")
    second = ask(client, "I like green tea.", first)
    ask(client, "What do I like?", first)
    ask(client, "And what is my name?", second)
    sent = last_sent(fake)
    assert "I like green tea." in sent and "What do I like?" not in sent
    assert client.responses.retrieve(second.id).output_text.startswith("ok")
    assert proxy.snapshot("assistant", "fork-redis").meta.head_seq == 10
