"""Memory works the same through the Responses API: tool result eviction with the
fetch_tool_result tool answered in hidden rounds (JSON and stream), and auto_compact's
compaction after the response, on a Responses upstream and a chat-only one."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from e2e import ADMIN_TOKEN, write_agent

from proxy.testing.fake_upstream import FakeUpstream, Reply

AGENT = "researcher"
SEARCH = {"type": "function", "name": "search",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
BIG_RESULT = "ATLANTIS DOSSIER: the capital is Poseidonia. " + " ".join(
    f"filler-{i}" for i in range(600)
)


@pytest.fixture
def agent(agents_dir):  # type: ignore[no-untyped-def]
    write_agent(
        agents_dir, AGENT,
        llm={"model": "gpt-4o", "contextWindow": 16000},
        memoryConfig={"kind": "auto_compact",
                      "toolResultEviction": {"afterTurns": 1, "aboveTokens": 500}},
        tools=[{"name": "search"}, {"name": "fetch_tool_result"}],
    )


def posts(fake: FakeUpstream) -> list[Any]:
    return [r for r in fake.requests if r.method == "POST"]


def sent(request: Any) -> str:
    body = request.body
    return json.dumps(body.get("input") if "input" in body else body.get("messages"))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_evicted_tool_result_is_fetched_back_in_a_hidden_round(agent, proxy, fake, stream):
    client = proxy.client(AGENT, f"evict-{stream}")
    fake.queue(
        Reply.tool_calls([{"id": "call_search_1", "name": "search",
                           "arguments": {"q": "atlantis"}}]),
        Reply.text("Found a dossier."),
        Reply.text("Noted."),
        Reply.tool_calls([{"id": "call_fetch_1", "name": "fetch_tool_result",
                           "arguments": {"tool_call_id": "call_search_1"}}]),
        Reply.text("The capital is Poseidonia."),
    )

    def create(**kwargs: Any) -> Any:
        if not stream:
            return client.responses.create(model="gpt-4o", tools=[SEARCH], **kwargs)
        with client.responses.stream(model="gpt-4o", tools=[SEARCH], **kwargs) as events:
            for _ in events:
                pass
            return events.get_final_response()

    first = create(input="Search for Atlantis.")
    second = create(previous_response_id=first.id, input=[
        {"type": "function_call_output", "call_id": "call_search_1", "output": BIG_RESULT}])
    third = create(previous_response_id=second.id, input="Thanks.")
    last = create(previous_response_id=third.id, input="What is the capital?")

    assert last.output_text == "The capital is Poseidonia."
    # the hidden round's reasoning went with it (its call is never stored); on a stream
    # with built-in tools offered, a round's reasoning items come at its end
    assert sorted(i.type for i in last.output) == (
        ["message", "reasoning"] if "input" in posts(fake)[-1].body else ["message"])
    hidden, fetching = posts(fake)[-1], posts(fake)[-2]
    # the request that asked sent the result evicted, the hidden round fetched it whole
    assert "Poseidonia" not in sent(fetching) and "fetch_tool_result" in sent(fetching)
    assert "Poseidonia" in sent(hidden)
    stored = proxy.stored(AGENT, f"evict-{stream}")
    assert not any("call_fetch_1" in json.dumps(m.tool_calls or []) for m in stored)
    assert stored[-1].content in ("The capital is Poseidonia.", [
        *stored[-1].content[:-1], {"type": "text", "text": "The capital is Poseidonia."}])


@pytest.fixture
def small_agent(agents_dir):  # type: ignore[no-untyped-def]
    write_agent(agents_dir, "small", llm={"model": "gpt-4o", "contextWindow": 3000},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.5})


def test_auto_compact_summarizes_after_a_responses_turn(small_agent, proxy, fake):
    client = proxy.client("small", "compact")
    previous = None
    for turn in range(4):
        fake.queue(Reply.text(f"Reply {turn}. " + "words " * 200))
        previous = client.responses.create(
            model="gpt-4o", input=f"Question {turn}: " + "detail " * 200,
            previous_response_id=previous.id if previous else None,
        )
    proxy.drain()
    memory = httpx.get(f"{proxy.base}/memory/small/compact",
                       headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert proxy.snapshot("small", "compact").summaries, memory
