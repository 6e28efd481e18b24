"""The fake upstream speaks OpenAI's wire format: checked with the official SDK."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from ports import free_port

from proxy.surfaces.chat_reply import ReplyAccumulator
from proxy.testing.fake_upstream import FakeUpstream, Reply, count_tokens_roughly
from proxy.upstreams.sse import parse_sse

ROOT = Path(__file__).resolve().parents[2]
MESSAGES: list[Any] = [{"role": "system", "content": "be brief"},
                       {"role": "user", "content": "hello there friend"}]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeUpstream]:
    with FakeUpstream.running(models=["fake-model", "fake-large"]) as fake:
        yield fake


@pytest.fixture
def fake(server: FakeUpstream) -> FakeUpstream:
    server.reset()
    return server


@pytest.fixture
async def client(fake: FakeUpstream) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=fake.url, api_key="sk-test", max_retries=0) as c:
        yield c


async def test_default_reply_echoes_the_last_user_message_with_usage(
    fake: FakeUpstream, client: openai.AsyncOpenAI
) -> None:
    completion = await client.chat.completions.create(model="fake-model", messages=MESSAGES)

    assert completion.choices[0].message.content == "ok: hello there friend"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "fake-model"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == count_tokens_roughly({"messages": MESSAGES})
    assert completion.usage.completion_tokens > 0


async def test_every_request_is_recorded_with_headers_and_body(
    fake: FakeUpstream, client: openai.AsyncOpenAI
) -> None:
    await client.chat.completions.create(model="fake-model", messages=MESSAGES,
                                         extra_headers={"X-Trace": "t1"})

    (request,) = fake.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["x-trace"] == "t1"
    assert request.body["messages"] == MESSAGES


async def test_scripted_replies_are_used_in_order_then_the_default(
    fake: FakeUpstream, client: openai.AsyncOpenAI
) -> None:
    fake.queue(Reply.text("one"), Reply.text("two"))

    replies = [
        (await client.chat.completions.create(model="m", messages=MESSAGES)).choices[0]
        .message.content
        for _ in range(3)
    ]

    assert replies == ["one", "two", "ok: hello there friend"]


async def test_streamed_text_arrives_in_openai_chunks_with_usage_last(
    fake: FakeUpstream, client: openai.AsyncOpenAI
) -> None:
    fake.queue(Reply.text("The quick brown fox"))

    stream = await client.chat.completions.create(
        model="fake-model", messages=MESSAGES, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]

    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices
              and c.choices[0].delta.content]
    assert pieces == ["The ", "quick ", "brown ", "fox"]
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


async def test_streamed_tool_calls_are_fragments_the_sdk_reassembles(
    fake: FakeUpstream, client: openai.AsyncOpenAI
) -> None:
    calls = [{"name": "search", "arguments": {"query": "weather in Paris tomorrow"}},
             {"id": "call_x", "name": "fetch", "arguments": '{"url": "https://example.org"}'}]
    fake.queue(Reply.tool_calls(calls))

    async with client.chat.completions.stream(model="fake-model", messages=MESSAGES) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()

    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in message.tool_calls or []] == ["search", "fetch"]
    assert orjson.loads((message.tool_calls or [])[0].function.arguments) == {
        "query": "weather in Paris tomorrow"}
    assert (message.tool_calls or [])[1].id == "call_x"


async def test_tool_call_arguments_are_split_into_several_fragments(fake: FakeUpstream) -> None:
    fake.queue(Reply.tool_calls([{"name": "f", "arguments": {"text": "x" * 40}}]))

    async with httpx.AsyncClient() as http:
        response = await http.post(f"{fake.url}/chat/completions",
                                   json={"model": "m", "messages": MESSAGES, "stream": True})
    events = parse_sse(response.content)
    fragments = [e for e in events if b'"arguments"' in e.data]
    acc = ReplyAccumulator()
    for event in events:
        acc.add_event(event)

    assert len(fragments) > 3
    assert acc.message()["tool_calls"][0]["function"]["arguments"] == (  # type: ignore[index]
        '{"text":"' + "x" * 40 + '"}')
    assert events[-1].done


async def test_error_reply_answers_its_status_and_body(
    fake: FakeUpstream, client: openai.AsyncOpenAI
) -> None:
    fake.queue(Reply.error(429, {"error": {"message": "slow down", "type": "rate_limit_error",
                                           "param": None, "code": "rate_limit_exceeded"}}))

    with pytest.raises(openai.RateLimitError) as raised:
        await client.chat.completions.create(model="m", messages=MESSAGES)

    assert raised.value.status_code == 429
    assert raised.value.code == "rate_limit_exceeded"


async def test_models_lists_the_configured_models(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()

    assert [m.id for m in models.data] == ["fake-model", "fake-large"]


async def test_unknown_paths_answer_an_openai_shaped_404(fake: FakeUpstream) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{fake.url}/embeddings", json={})

    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


async def test_a_cut_stream_ends_without_finish_or_done(fake: FakeUpstream) -> None:
    fake.queue(Reply.stream_cut(after_chunks=2, text="one two three four"))

    async with httpx.AsyncClient() as http:
        received = b""
        with pytest.raises(httpx.RemoteProtocolError):
            async with http.stream("POST", f"{fake.url}/chat/completions",
                                   json={"model": "m", "messages": MESSAGES,
                                         "stream": True}) as response:
                async for part in response.aiter_bytes():
                    received += part

    events = parse_sse(received)
    assert len(events) == 2
    assert not any(e.done for e in events)


async def test_a_client_leaving_mid_stream_is_counted_as_a_disconnect(
    fake: FakeUpstream,
) -> None:
    fake.queue(Reply.text("a b c d e f g h", delay_between_chunks=0.1))
    body = orjson.dumps({"model": "m", "messages": MESSAGES, "stream": True})

    reader, writer = await asyncio.open_connection("127.0.0.1", fake.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    await reader.readuntil(b"data: ")  # the stream has started
    writer.close()
    await writer.wait_closed()

    assert await asyncio.to_thread(fake.wait_for_disconnect, 5)
    assert fake.disconnects == 1


async def test_slow_first_token_delays_a_non_streaming_reply(
    fake: FakeUpstream, client: openai.AsyncOpenAI
) -> None:
    fake.queue(Reply.slow_first_token(delay=0.3, text="late"))

    started = time.monotonic()
    completion = await client.chat.completions.create(model="m", messages=MESSAGES)

    assert completion.choices[0].message.content == "late"
    assert time.monotonic() - started >= 0.3


async def test_a_held_reply_waits_for_its_event_and_release_frees_it(
    fake: FakeUpstream, client: openai.AsyncOpenAI
) -> None:
    written, forgotten = threading.Event(), threading.Event()
    fake.queue(Reply.text("held", until=written), Reply.text("never released", until=forgotten))

    first = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
    await asyncio.sleep(0.2)
    assert not first.done()  # headers are sent; the body waits for the event
    written.set()
    assert (await first).choices[0].message.content == "held"

    second = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
    await asyncio.sleep(0.2)
    assert not second.done()
    fake.release()
    assert (await second).choices[0].message.content == "never released"
    assert forgotten.is_set()


async def test_reset_waits_for_replies_in_flight_and_restores_the_defaults(
    fake: FakeUpstream, client: openai.AsyncOpenAI
) -> None:
    fake.default_reply = lambda body: Reply.text("custom")
    fake.count_tokens = lambda body: 7
    fake.queue(Reply.text("late", first_token_delay=0.3), Reply.text("scripted"))
    late = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
    await asyncio.to_thread(lambda: wait_until(lambda: fake.chat_requests))

    await asyncio.to_thread(fake.reset)  # waits for the reply in flight, then forgets it
    assert fake.requests == []
    assert (await late).choices[0].message.content == "late"
    completion = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert completion.choices[0].message.content == "ok: hello there friend"  # the echo
    assert completion.usage is not None and completion.usage.prompt_tokens != 7


def wait_until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


async def test_the_token_counter_is_pluggable() -> None:
    async with FakeUpstream.running(count_tokens=lambda body: 1234) as fake:
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{fake.url}/chat/completions",
                                       json={"model": "m", "messages": MESSAGES})

    assert response.json()["usage"]["prompt_tokens"] == 1234


def test_the_module_serves_standalone_from_the_command_line() -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "proxy.testing.fake_upstream",
            "--port", str(port), "--reply-words", "3",
        ],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                      json={"model": "m", "messages": MESSAGES})
                break
            except httpx.ConnectError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        assert response.json()["choices"][0]["message"]["content"] == "word0 word1 word2"
    finally:
        process.terminate()
        process.wait(10)
