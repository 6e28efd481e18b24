"""Redis down or stalled: requests fail fast with an OpenAI-shaped 503 and Retry-After, the
proxy starts anyway, ``/ready`` says so, and it recovers on its own.

Each test owns its ``redis-server`` (it gets stopped and frozen with SIGSTOP).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from e2e import CLIENT_KEY, RunningProxy
from ports import free_port
from redis_server import RedisServer
from reliability_support import is_openai_error, report

from proxy.testing.fake_upstream import FakeUpstream, Reply

FAIL_FAST = 2.0


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = RedisServer(port=free_port())
    yield server
    server.close()


@pytest.fixture
def store_url(redis: RedisServer) -> str:
    return redis.url


def chat(
    proxy: RunningProxy, session: str, *, stream: bool = False
) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(
        f"{proxy.url('helper', session)}/chat/completions",
        json={"model": "gpt-4o", "stream": stream,
              "messages": [{"role": "user", "content": "hello"}]},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        timeout=30,
    )
    return response, time.monotonic() - started


def ready(proxy: RunningProxy) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.get(f"{proxy.base}/ready", timeout=30)
    return response, time.monotonic() - started


def assert_unavailable(response: httpx.Response, elapsed: float) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert is_openai_error(response.json())
    assert response.json()["error"]["code"] == "memory_store_unavailable"
    assert elapsed <= FAIL_FAST


def test_the_proxy_starts_with_redis_down_and_recovers_when_it_comes_up(
    make_proxy: Any, redis: RedisServer, fake: FakeUpstream
) -> None:
    proxy = make_proxy()  # nothing listens on the port yet
    assert httpx.get(f"{proxy.base}/health").status_code == 200
    answer, waited = ready(proxy)
    assert answer.status_code == 503 and answer.json()["store"] == "unreachable"
    assert answer.headers["retry-after"] == "1" and waited <= FAIL_FAST
    timings = []
    for stream in (False, True):
        response, elapsed = chat(proxy, "down", stream=stream)
        assert_unavailable(response, elapsed)
        timings.append(round(elapsed, 3))
    assert fake.chat_requests == []  # nothing was sent upstream for a turn it cannot store
    report("redis down", chat_503_seconds=timings, ready_503_seconds=round(waited, 3))

    redis.start()
    assert ready(proxy)[0].status_code == 200
    response, _ = chat(proxy, "down")
    assert response.status_code == 200
    assert [m.role for m in proxy.stored("helper", "down")] == ["user", "assistant"]


def test_a_frozen_redis_fails_requests_within_two_seconds_and_thaws_cleanly(
    make_proxy: Any, redis: RedisServer, fake: FakeUpstream
) -> None:
    redis.start()
    proxy = make_proxy()
    assert chat(proxy, "frozen")[0].status_code == 200
    redis.kill(signal.SIGSTOP)
    try:
        timings = []
        for stream in (False, True):
            response, elapsed = chat(proxy, "frozen", stream=stream)
            assert_unavailable(response, elapsed)
            timings.append(elapsed)
        answer, waited = ready(proxy)
        assert answer.status_code == 503 and waited <= FAIL_FAST + 0.5
    finally:
        redis.kill(signal.SIGCONT)
    started = time.monotonic()
    while ready(proxy)[0].status_code != 200:
        assert time.monotonic() - started < 5
        time.sleep(0.05)
    recovered = time.monotonic() - started
    response, _ = chat(proxy, "frozen")
    assert response.status_code == 200
    assert len(proxy.stored("helper", "frozen")) == 4
    report("frozen redis", chat_503_seconds=[round(t, 2) for t in timings],
           ready_503_seconds=round(waited, 2), recovered_after_thaw_seconds=round(recovered, 2))


def test_a_turn_whose_write_froze_with_redis_is_stored_once_after_sdk_retries(
    make_proxy: Any, redis: RedisServer, fake: FakeUpstream
) -> None:
    """Redis freezes while the model answers: the write's reply times out. Before it
    answers, the proxy asks whether the write applied (it did when Redis thawed within that
    check): the turn is acknowledged then, or answered 503 and never stored, and the SDK's
    retry stores it then. Either way the turn is stored once, with the reply the client
    got."""
    redis.start()
    proxy = make_proxy()
    proxy.client("helper", "thaw").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "first"}])
    fake.queue(Reply.text("while frozen", first_token_delay=0.5), Reply.text("after thaw"))
    client = openai.OpenAI(base_url=proxy.url("helper", "thaw"), api_key=CLIENT_KEY,
                           max_retries=3, timeout=10)
    result: dict[str, Any] = {}

    def call() -> None:
        result["reply"] = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "second"}])

    caller = threading.Thread(target=call)
    caller.start()
    while len(fake.chat_requests) < 2:
        time.sleep(0.005)
    redis.kill(signal.SIGSTOP)  # the model is answering; the write is next
    time.sleep(2.5)  # the reply (0.5 s) plus the 1.5 s socket timeout: the proxy said 503
    redis.kill(signal.SIGCONT)
    caller.join(30)
    answer = result["reply"].choices[0].message.content
    assert answer in ("while frozen", "after thaw")
    stored = [(m.role, m.content) for m in proxy.stored("helper", "thaw")]
    assert stored == [("user", "first"), ("assistant", "ok: first"),
                      ("user", "second"), ("assistant", answer)]
    key = proxy.key("helper", "thaw")
    every = [m.content for m in proxy.call(proxy.services.store.get_messages(key, range(1, 20)))]
    # whether the frozen write applied at thaw (then superseded by the retry) or was dropped
    report("write frozen with redis", acknowledged_at_thaw=answer == "while frozen",
           applied_after_thaw="while frozen" in every, records=len(every))
