"""Upstream faults: the client gets a clean OpenAI-shaped error (or an error event in a
stream) and nothing of the failed turn is stored; a client that goes away cancels the
upstream call within a second.

What is stored of a cut reply: nothing. Neither the partial reply nor the turn's new
input is written, the stream ends with an error event instead of ``[DONE]``, and the next
turn sees the session as it was before (docs/RELIABILITY.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e import CLIENT_KEY, RunningProxy
from ports import free_port
from reliability_support import is_openai_error, report

from proxy.testing.fake_upstream import FakeUpstream, Reply

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """Upstream faults do not depend on the store: the embedded one is enough here."""
    return f"sqlite:///{tmp_path}/memory.db"


def post(proxy: RunningProxy, session: str, *, stream: bool = False,
         timeout: float = 20) -> httpx.Response:
    return httpx.post(
        f"{proxy.url('helper', session)}/chat/completions",
        json={"model": "gpt-4o", "stream": stream, "messages": HI},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=timeout,
    )


def sse_events(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]


def assert_error_event(response: httpx.Response, code: str) -> None:
    assert response.status_code == 200
    events = sse_events(response)
    assert events and events[-1] != "[DONE]"
    last = json.loads(events[-1])
    assert is_openai_error(last) and last["error"]["code"] == code


def assert_nothing_stored_and_session_usable(proxy: RunningProxy, session: str) -> None:
    assert proxy.stored("helper", session) == []
    assert post(proxy, session).status_code == 200
    assert [m.content for m in proxy.stored("helper", session)] == ["hi", "ok: hi"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_upstream_slower_than_the_timeout_gives_a_clean_timeout_error(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream, stream: bool
) -> None:
    proxy = make_proxy(upstream_timeout=0.5)
    fake.queue(Reply.slow_first_token(3.0))
    started = time.monotonic()
    response = post(proxy, f"slow-{stream}", stream=stream)
    assert time.monotonic() - started < 2.0
    if stream:
        assert_error_event(response, "upstream_timeout")
    else:
        assert response.status_code == 504 and is_openai_error(response.json())
        assert response.json()["error"]["code"] == "upstream_timeout"
    assert_nothing_stored_and_session_usable(proxy, f"slow-{stream}")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_slow_first_token_within_the_timeout_is_just_slow(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream, stream: bool
) -> None:
    proxy = make_proxy(upstream_timeout=3.0)
    fake.queue(Reply.slow_first_token(1.0, text="late but fine"))
    response = post(proxy, f"late-{stream}", stream=stream)
    assert response.status_code == 200
    if stream:
        assert sse_events(response)[-1] == "[DONE]"
    assert [m.content for m in proxy.stored("helper", f"late-{stream}")] == ["hi", "late but fine"]


@pytest.mark.parametrize("status", [500, 502, 503])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_upstream_5xx_passes_through_openai_shaped_and_stores_nothing(
    proxy: RunningProxy, fake: FakeUpstream, status: int, stream: bool
) -> None:
    # a load balancer's HTML page, not JSON: still an OpenAI-shaped error for the client
    fake.queue(Reply.error(status, "<html>bad gateway</html>", content_type="text/html"))
    response = post(proxy, f"e{status}-{stream}", stream=stream)
    assert response.status_code == status
    assert is_openai_error(response.json())
    assert_nothing_stored_and_session_usable(proxy, f"e{status}-{stream}")


@pytest.mark.parametrize("after_chunks", [1, 3])
def test_a_stream_cut_mid_way_ends_with_an_error_event_and_stores_nothing_of_the_turn(
    proxy: RunningProxy, fake: FakeUpstream, after_chunks: int
) -> None:
    post(proxy, "cut")
    fake.queue(Reply.stream_cut(after_chunks=after_chunks, text="a b c d e f g h"))
    response = httpx.post(
        f"{proxy.url('helper', 'cut')}/chat/completions",
        json={"model": "gpt-4o", "stream": True,
              "messages": [{"role": "user", "content": "tell me more"}]},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=20,
    )
    assert_error_event(response, "upstream_unreachable")
    # what the client saw before the cut was forwarded as it came
    assert len(sse_events(response)) == after_chunks + 1
    assert [m.content for m in proxy.stored("helper", "cut")] == ["hi", "ok: hi"]
    # the next turn is sent the session as it was before the cut turn
    post(proxy, "cut")
    assert [m["content"] for m in fake.chat_requests[-1].body["messages"]] == [
        "hi", "ok: hi", "hi"]


def test_a_non_streaming_reply_cut_short_is_a_502_and_stores_nothing(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    fake.queue(Reply.stream_cut())
    response = post(proxy, "cut-json")
    assert response.status_code == 502 and is_openai_error(response.json())
    assert_nothing_stored_and_session_usable(proxy, "cut-json")


def test_an_unreachable_upstream_is_a_502(make_proxy: Callable[..., RunningProxy]) -> None:
    proxy = make_proxy(upstream_url=f"http://127.0.0.1:{free_port()}/v1")
    for stream in (False, True):
        response = post(proxy, "nobody", stream=stream)
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_unreachable"
    assert proxy.stored("helper", "nobody") == []


def walk_away(proxy: RunningProxy, how: str) -> float:
    """Start a turn, give up on it, return when the client gave up (monotonic)."""
    url = f"{proxy.url('helper', 'gone-' + how)}/chat/completions"
    body: dict[str, Any] = {"model": "gpt-4o", "stream": how != "json", "messages": HI}
    auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
    if how == "mid-stream":
        with httpx.stream("POST", url, json=body, headers=auth, timeout=20) as response:
            for line in response.iter_lines():
                if "word" in line:
                    break
            gave_up = time.monotonic()
        return gave_up
    with pytest.raises(httpx.ReadTimeout):
        if how == "json":
            httpx.post(url, json=body, headers=auth, timeout=0.5)
        else:
            with httpx.stream("POST", url, json=body, headers=auth, timeout=0.5) as response:
                for _ in response.iter_lines():
                    pass
    return time.monotonic()


@pytest.mark.parametrize("how", ["json", "sse-before-first-token", "mid-stream"])
def test_a_client_that_goes_away_cancels_the_upstream_within_a_second(
    proxy: RunningProxy, fake: FakeUpstream, how: str
) -> None:
    if how == "mid-stream":
        fake.queue(Reply.text(" ".join(["word"] * 300), delay_between_chunks=0.05))
    else:
        fake.queue(Reply.slow_first_token(10.0))
    gave_up = walk_away(proxy, how)
    assert fake.wait_for_disconnect(timeout=5.0)
    lag = time.monotonic() - gave_up
    assert lag <= 1.0
    proxy.drain()
    assert proxy.stored("helper", f"gone-{how}") == []
    report("client disconnect", mode=how, upstream_cancelled_after_seconds=round(lag, 3))


NOT_COMPLETIONS = [
    pytest.param('{"error": {"message": "overloaded", "type": "server_error"}}',
                 "application/json", id="error-object"),
    pytest.param('{"foo": 1}', "application/json", id="other-json"),
    pytest.param('{"id": "c1", "object": "chat.completion", "choices": []}',
                 "application/json", id="no-choices"),
    pytest.param("Service is being upgraded, try later", "text/plain", id="plain-text"),
]


@pytest.mark.parametrize(("body", "content_type"), NOT_COMPLETIONS)
def test_a_200_that_is_not_a_chat_completion_is_an_upstream_error_and_stores_nothing(
    proxy: RunningProxy, fake: FakeUpstream, body: str, content_type: str
) -> None:
    fake.queue(Reply.raw(body, content_type=content_type))
    response = post(proxy, "junk")
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    error = response.json()
    assert is_openai_error(error) and error["error"]["code"] == "upstream_invalid_reply"
    assert "upstream sent a reply that is not a chat completion" in error["error"]["message"]
    assert_nothing_stored_and_session_usable(proxy, "junk")


def chunk(**fields: Any) -> str:
    return "data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", **fields})


NOT_STREAMS = [
    pytest.param('data: {"error": {"message": "overloaded"}}\n\ndata: [DONE]\n\n',
                 id="only-an-error-event"),
    pytest.param(f"{chunk(choices=[])}\n\n{chunk(choices=[])}\n\ndata: [DONE]\n\n",
                 id="empty-choices"),
    pytest.param(f"{chunk(choices=[{'index': 0, 'delta': {'content': 'half'}}])}\n\n"
                 'data: {"error": {"message": "overloaded"}}\n\ndata: [DONE]\n\n',
                 id="an-error-event-mid-stream"),
    pytest.param("data: hello there\n\ndata: [DONE]\n\n", id="a-text-event"),
    pytest.param("data: {not json at all\n\ndata: [DONE]\n\n", id="broken-json"),
    pytest.param(f"{chunk(choices='junk')}\n\ndata: [DONE]\n\n", id="choices-not-a-list"),
    pytest.param("<html>upgrading</html>", id="not-sse"),
]


@pytest.mark.parametrize("body", NOT_STREAMS)
def test_a_stream_that_is_not_a_chat_completion_ends_with_an_error_event_and_stores_nothing(
    proxy: RunningProxy, fake: FakeUpstream, body: str
) -> None:
    fake.queue(Reply.raw(body, content_type="text/event-stream"))
    response = post(proxy, "junk-sse", stream=True)
    assert_error_event(response, "upstream_invalid_reply")
    assert "not a chat completion" in json.loads(sse_events(response)[-1])["error"]["message"]
    assert_nothing_stored_and_session_usable(proxy, "junk-sse")


def test_without_memory_a_200_passes_through_with_the_upstreams_own_content_type(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    fake.queue(Reply.raw("plain words", content_type="text/plain; charset=utf-8"))
    response = httpx.post(
        f"{proxy.url()}/chat/completions", json={"model": "gpt-4o", "messages": HI},
        headers={"Authorization": f"Bearer {CLIENT_KEY}", "X-Memory": "off"}, timeout=20,
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.text == "plain words"
