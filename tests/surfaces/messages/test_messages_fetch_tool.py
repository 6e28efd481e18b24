"""fetch_tool_result on the Messages surface: an evicted tool result goes out as a stub,
the proxy offers the tool, answers the model's call from the store in a hidden round and
calls the model again; Anthropic's SDK sees one clean answer, whole or streamed."""

from __future__ import annotations

import anthropic
import orjson
import pytest
from e2e import CLIENT_KEY, write_agent

from proxy.testing.fake_messages import thinking
from proxy.testing.fake_upstream import Reply

MODEL = "claude-sonnet-4-5"
AGENT = "fetcher"
BIG_RESULT = "ATLANTIS DOSSIER: the capital is Poseidonia. " + " ".join(
    f"filler-{i}" for i in range(600))
TOOLS = [{"name": "search", "description": "Search",
          "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]


@pytest.fixture
def api(messages_proxy, agents_dir):
    write_agent(agents_dir, AGENT, llm={"model": MODEL, "contextWindow": 16000},
                memoryConfig={"kind": "auto_compact",
                              "toolResultEviction": {"afterTurns": 1, "aboveTokens": 500}},
                tools=[{"name": "search"}, {"name": "fetch_tool_result"}])
    proxy = messages_proxy()
    made = anthropic.Anthropic(base_url=f"{proxy.base}/agents/{AGENT}/sessions/s1",
                               api_key=CLIENT_KEY, max_retries=0, timeout=20)
    proxy.clients.append(made)
    return proxy, made


def search_turn(api, fake) -> list[dict]:
    """A first turn whose search result is big: evicted in later turns."""
    fake.queue(Reply.tool_calls([{"id": "call_search_1", "name": "search",
                                  "arguments": {"q": "atlantis"}}]),
               Reply.text("Found the dossier."))
    history = [{"role": "user", "content": "Research Atlantis."}]
    first = api.messages.create(model=MODEL, max_tokens=100, tools=TOOLS, messages=history)
    history += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result",
                                              "tool_use_id": first.content[0].id,
                                              "content": BIG_RESULT}]}]
    second = api.messages.create(model=MODEL, max_tokens=100, tools=TOOLS, messages=history)
    history += [{"role": "assistant", "content": [b.model_dump() for b in second.content]},
                {"role": "user", "content": "What is the capital?"}]
    return history


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
def test_an_evicted_result_is_fetched_in_a_hidden_round(api, fake, streaming):
    proxy, client = api
    history = search_turn(client, fake)
    fake.queue(
        thinking(Reply.tool_calls([{"id": "call_fetch_1", "name": "fetch_tool_result",
                                    "arguments": {"tool_call_id": "toolu_search_1"}}]),
                 "I need the evicted result", signature="SIG-F"),
        Reply.text("The capital is Poseidonia."),
    )
    if streaming:
        with client.messages.stream(model=MODEL, max_tokens=100, tools=TOOLS,
                                    messages=history) as stream:
            final = stream.get_final_message()
    else:
        final = client.messages.create(model=MODEL, max_tokens=100, tools=TOOLS,
                                       messages=history)
    texts = [b.text for b in final.content if b.type == "text"]
    assert texts[-1] == "The capital is Poseidonia."
    assert not [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "end_turn"

    asked, hidden = fake.message_requests[-2:]
    sent = orjson.dumps(asked.body["messages"]).decode()
    assert BIG_RESULT not in sent and "fetch_tool_result" in sent  # the stub
    assert [t["name"] for t in asked.body["tools"]] == ["search", "fetch_tool_result"]
    hidden_result = hidden.body["messages"][-1]["content"][0]
    assert hidden_result["type"] == "tool_result"
    assert "Poseidonia" in orjson.dumps(hidden_result).decode()
    # the thinking of the hidden call went back with it
    assert hidden.body["messages"][-2]["content"][0]["signature"] == "SIG-F"
    stored = proxy.stored(AGENT, "s1")
    assert stored[-1].role == "assistant"
    assert "fetch_tool_result" not in orjson.dumps(stored[-1].tool_calls or []).decode()
