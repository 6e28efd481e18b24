"""The benchmark's instant upstream answers what the fake upstream answers, byte for byte
but for the ids and times, over real HTTP on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from ports import free_port

from proxy.testing.fake_upstream import FakeUpstream
from proxy.upstreams.sse import parse_sse

ROOT = Path(__file__).resolve().parents[2]
MESSAGES: list[Any] = [
    {"role": "system", "content": "be brief"},
    {"role": "assistant", "content": "earlier answer"},
    {"role": "user", "content": "hello there friend, what is the plan for today?"},
]


@pytest.fixture(scope="module")
def instant() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "instant_upstream.py"), "--port", str(port)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                httpx.get(url + "/models").raise_for_status()
                break
            except httpx.ConnectError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream.running() as server:
        yield server


def _without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k not in ("id", "created")}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


def _events(response: httpx.Response) -> list[Any]:
    return [
        "[DONE]" if event.done else _without_ids(orjson.loads(event.data))
        for event in parse_sse(response.content)
    ]


@pytest.mark.parametrize("extra", [
    {},
    {"stream": True},
    {"stream": True, "stream_options": {"include_usage": True}},
])
def test_a_chat_completion_is_answered_as_the_fake_answers_it(
    instant: str, fake: FakeUpstream, extra: dict[str, Any]
) -> None:
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, **extra}
    with httpx.Client() as client:
        mine = client.post(instant + "/chat/completions", json=body)
        theirs = client.post(fake.url + "/chat/completions", json=body)
    assert mine.status_code == theirs.status_code == 200
    assert mine.headers["content-type"] == theirs.headers["content-type"]
    if extra.get("stream"):
        assert mine.headers["transfer-encoding"] == "chunked"
        assert _events(mine) == _events(theirs)
        assert _events(mine)[-1] == "[DONE]"
    else:
        assert _without_ids(mine.json()) == _without_ids(theirs.json())
        assert mine.json()["choices"][0]["message"]["content"].startswith("ok: hello there")


def test_one_connection_carries_many_requests_and_the_sdk_reads_them(instant: str) -> None:
    with openai.OpenAI(base_url=instant, api_key="sk-test", max_retries=0) as client:
        for n in range(3):
            question = {"role": "user", "content": f"question {n}"}
            completion = client.chat.completions.create(model="m", messages=[question])
            assert completion.choices[0].message.content == f"ok: question {n}"
            assert completion.usage is not None and completion.usage.prompt_tokens > 0
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "one two"}], stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream) == "ok: one two"


def test_bad_requests_get_an_openai_shaped_4xx(instant: str) -> None:
    with httpx.Client() as client:
        not_json = client.post(instant + "/chat/completions", content=b"{nope")
        elsewhere = client.post(instant + "/embeddings", json={"input": "x"})
        after = client.post(instant + "/chat/completions",
                            json={"model": "m", "messages": MESSAGES})
    assert not_json.status_code == 400
    assert set(not_json.json()["error"]) == {"message", "type", "param", "code"}
    assert elsewhere.status_code == 404
    assert elsewhere.json()["error"]["type"] == "not_found_error"
    assert after.status_code == 200  # the connection still serves
