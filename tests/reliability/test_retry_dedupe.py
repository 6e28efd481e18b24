"""A retried identical request never stores a message twice.

The openai SDK retries on 5xx, timeouts and connection errors with the same body and
``x-stainless-retry-count`` above 0. When the first attempt was stored but its answer was
lost, the retry regenerates that turn: its input is not appended again, the earlier reply
is superseded (kept, never sent). Full-history clients are matched by chain hashes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from e2e import CLIENT_KEY, RunningProxy

from proxy.testing.fake_upstream import FakeUpstream, Reply
from storage.base import StoreUnavailable
from strategies.records import SessionKey, TurnWrite


@pytest.fixture(autouse=True)
def sdk_retries_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK retries as it does (the same body, ``x-stainless-retry-count`` above 0),
    without waiting between attempts: what gets stored does not depend on the wait."""
    monkeypatch.setattr(openai._base_client.BaseClient, "_calculate_retry_timeout",
                        lambda *args, **kwargs: 0.0)


def post(proxy: RunningProxy, session: str, messages: list[dict[str, Any]],
         headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{proxy.url('helper', session)}/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"Authorization": f"Bearer {CLIENT_KEY}", **(headers or {})},
        timeout=10,
    )


def contents(proxy: RunningProxy, session: str) -> list[tuple[str, Any]]:
    return [(m.role, m.content) for m in proxy.stored("helper", session)]


def all_stored(proxy: RunningProxy, session: str) -> list[Any]:
    key = proxy.key("helper", session)
    return [m.content for m in proxy.call(proxy.services.store.get_messages(key, range(1, 50)))]


def lose_the_answer_once(proxy: RunningProxy, how: str) -> list[int]:
    """Store the first turn for real, then lose its answer: the store call fails after the
    write (``error``) or takes longer than the client waits (``slow``)."""
    store = proxy.services.store
    real = store.append_turn
    calls: list[int] = []

    async def append_turn(key: SessionKey, write: TurnWrite, **hints: Any) -> Any:
        result = await real(key, write, **hints)
        calls.append(len(write.messages))
        if len(calls) == 1:
            if how == "error":
                raise StoreUnavailable("the write applied but its reply was lost")
            await asyncio.sleep(2.0)
        return result

    store.append_turn = append_turn  # type: ignore[method-assign]
    return calls


def sdk(proxy: RunningProxy, session: str, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url("helper", session), api_key=CLIENT_KEY,
                         max_retries=2, **{"timeout": 10.0, **kwargs})


@pytest.mark.parametrize("how", ["error", "slow"])
def test_an_sdk_retry_after_a_stored_but_unanswered_turn_stores_it_once(
    proxy: RunningProxy, fake: FakeUpstream, how: str
) -> None:
    proxy.client("helper", f"r-{how}").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "first"}])
    calls = lose_the_answer_once(proxy, how)
    fake.queue(Reply.text("lost answer"), Reply.text("answer seen"))
    client = sdk(proxy, f"r-{how}", timeout=1.0 if how == "slow" else 10.0)
    reply = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "second"}])
    assert reply.choices[0].message.content == "answer seen"
    assert len(fake.chat_requests) == 3  # first turn, the lost attempt, the retry
    assert contents(proxy, f"r-{how}") == [
        ("user", "first"), ("assistant", "ok: first"),
        ("user", "second"), ("assistant", "answer seen")]
    # the retry sent the model the same conversation as the first attempt
    assert fake.chat_requests[-1].body["messages"] == fake.chat_requests[-2].body["messages"]
    # the lost reply is superseded, not deleted; the retry wrote only its own reply
    assert "lost answer" in all_stored(proxy, f"r-{how}")
    assert calls == [2, 1]


def test_a_full_history_sdk_retry_stores_the_turn_once(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    history = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
               {"role": "user", "content": "q2"}]
    fake.queue(Reply.text("a1"))
    proxy.client("helper", "full").chat.completions.create(model="gpt-4o", messages=history[:1])
    lose_the_answer_once(proxy, "error")
    fake.queue(Reply.text("lost"), Reply.text("a2"))
    sdk(proxy, "full").chat.completions.create(model="gpt-4o", messages=history)
    assert [c for _, c in contents(proxy, "full")] == ["q1", "a1", "q2", "a2"]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_tool_result_retry_is_not_stored_twice(proxy: RunningProxy, fake: FakeUpstream) -> None:
    client = proxy.client("helper", "tools")
    fake.queue(Reply.tool_calls([{"id": "call_9", "name": "lookup", "arguments": {"q": 1}}]))
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "look"}])
    lose_the_answer_once(proxy, "error")
    fake.queue(Reply.text("lost"), Reply.text("found it"))
    sdk(proxy, "tools").chat.completions.create(
        model="gpt-4o", messages=[{"role": "tool", "tool_call_id": "call_9", "content": "42"}])
    assert [role for role, _ in contents(proxy, "tools")] == ["user", "assistant", "tool",
                                                             "assistant"]
    assert contents(proxy, "tools")[-1] == ("assistant", "found it")


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_same_message_sent_twice_without_a_retry_sign_is_two_turns(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    for _ in range(2):
        assert post(proxy, "twice", [{"role": "user", "content": "continue"}]).status_code == 200
    assert [c for _, c in contents(proxy, "twice")] == [
        "continue", "ok: continue", "continue", "ok: continue"]


def test_an_idempotency_key_replays_only_its_own_turn(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    hi = [{"role": "user", "content": "hi"}]
    post(proxy, "idem", hi, {"Idempotency-Key": "k-1"})
    fake.queue(Reply.text("again"))
    post(proxy, "idem", hi, {"Idempotency-Key": "k-1"})  # a replay of k-1: regenerated
    assert contents(proxy, "idem") == [("user", "hi"), ("assistant", "again")]
    post(proxy, "idem", hi, {"Idempotency-Key": "k-2", "x-stainless-retry-count": "1"})
    assert [c for _, c in contents(proxy, "idem")] == ["hi", "again", "hi", "ok: hi"]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_retry_of_an_attempt_that_stored_nothing_is_stored_once(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    post(proxy, "fail", [{"role": "user", "content": "one"}])
    fake.queue(Reply.error(500), Reply.text("two done"))
    sdk(proxy, "fail").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "two"}])
    assert [c for _, c in contents(proxy, "fail")] == ["one", "ok: one", "two", "two done"]
