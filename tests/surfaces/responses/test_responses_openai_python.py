"""openai-python's ``responses.create`` and ``responses.stream`` through the proxy, with
tools, continued by ``previous_response_id``: the proxy holds the state, whatever the
upstream (see conftest: a Responses upstream, a chat-completions-only one)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from proxy.testing.fake_responses import FakeResponsesUpstream
from proxy.testing.fake_upstream import FakeUpstream, Reply

MODEL = "gpt-4o"
TOOLS: list[Any] = [{
    "type": "function", "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}]


def upstream_calls(fake: FakeUpstream) -> list[Any]:
    return [r for r in fake.requests if r.method == "POST"]


def sent_texts(request: Any) -> str:
    """Everything a recorded upstream request carried, as one text to search."""
    import json

    body = request.body
    return json.dumps(body.get("input") if "input" in body else body.get("messages"))


def native(fake: FakeUpstream) -> bool:
    return isinstance(fake, FakeResponsesUpstream)


def test_a_tool_loop_continues_by_previous_response_id_with_the_state_in_the_proxy(
    proxy, fake
):
    client = proxy.client("assistant", None)
    fake.queue(
        Reply.tool_calls([{"id": "call_1", "name": "get_weather",
                           "arguments": {"city": "Paris"}}]),
        Reply.text("Sunny in Paris."),
        Reply.text("You asked about Paris."),
    )
    first = client.responses.create(
        model=MODEL, instructions="You are terse.", input="Weather in Paris?", tools=TOOLS
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, c.call_id, c.arguments) for c in calls] == [
        ("get_weather", "call_1", '{"city":"Paris"}')]
    assert first.id.startswith("resp_") and first.status == "completed"

    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
    )
    assert second.output_text == "Sunny in Paris."
    assert second.usage is not None and second.usage.input_tokens > 0

    third = client.responses.create(
        model=MODEL, previous_response_id=second.id, input="Which city was it?"
    )
    assert third.output_text == "You asked about Paris."
    last = upstream_calls(fake)[-1]
    text = sent_texts(last)
    # the whole chain reached the upstream though the client sent one message
    for fact in ("Weather in Paris?", "call_1", "sunny", "Sunny in Paris.", "You are terse."):
        assert fact in text or fact in str(last.body.get("instructions")), fact
    if native(fake):
        assert last.path.endswith("/responses")
        # the reasoning items of both earlier replies went back byte for byte
        reasoning = [i for i in last.body["input"] if i.get("type") == "reasoning"]
        assert [r["encrypted_content"] for r in reasoning] == [
            first.output[0].encrypted_content, second.output[0].encrypted_content]
        kinds = [i.get("type") for i in last.body["input"]]
        assert kinds.index("reasoning") < kinds.index("function_call") < kinds.index(
            "function_call_output")
    else:
        assert last.path.endswith("/chat/completions")
        roles = [m["role"] for m in last.body["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]


def test_a_stored_response_is_retrieved_listed_and_deleted(proxy, fake):
    client = proxy.client("assistant", "s1")
    fake.queue(Reply.text("Hello there."))
    created = client.responses.create(model=MODEL, input="Hi!", metadata={"k": "v"})
    fetched = client.responses.retrieve(created.id)
    assert fetched.id == created.id
    assert fetched.output_text == "Hello there."
    assert fetched.metadata == {"k": "v"}
    assert fetched.usage is not None and fetched.usage.output_tokens > 0
    items = client.responses.input_items.list(created.id)
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]
    assert items.data[0].content[0].text == "Hi!"

    other = proxy.client("assistant", "s1", api_key="sk-another-key")
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(created.id)  # another API key's response

    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, previous_response_id=created.id, input="again")
    assert raised.value.code == "previous_response_not_found"


def test_a_response_with_store_false_is_not_retrievable_but_remembered(proxy, fake):
    client = proxy.client("assistant", "s2")
    fake.queue(Reply.text("Noted."), Reply.text("CODE-7."))
    created = client.responses.create(model=MODEL, input="The code is CODE-7.", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    client.responses.create(model=MODEL, input="Which code?", store=False)
    assert "The code is CODE-7." in sent_texts(upstream_calls(fake)[-1])


def test_responses_stream_emits_the_event_sequence_with_tools(proxy, fake):
    client = proxy.client("assistant", "s3")
    fake.queue(
        Reply.tool_calls([{"id": "call_9", "name": "get_weather",
                           "arguments": {"city": "Lyon"}}]),
        Reply.text("Rain in Lyon today."),
    )
    with client.responses.stream(model=MODEL, input="Weather in Lyon?", tools=TOOLS) as stream:
        events = list(stream)
        first = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    [call] = [i for i in first.output if i.type == "function_call"]
    assert (call.name, call.call_id, call.arguments) == ("get_weather", "call_9",
                                                         '{"city":"Lyon"}')

    with client.responses.stream(
        model=MODEL, previous_response_id=first.id, tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": "call_9", "output": "rain"}],
    ) as stream:
        kinds = [e.type for e in stream]
        second = stream.get_final_response()
    assert second.output_text == "Rain in Lyon today."
    assert kinds.count("response.output_text.delta") >= 2
    assert {"response.output_item.added", "response.content_part.added",
            "response.output_text.done", "response.output_item.done"} <= set(kinds)
    # stored from the stream: the next turn's upstream request holds both turns
    fake.queue(Reply.text("ok"))
    client.responses.create(model=MODEL, previous_response_id=second.id, input="Thanks")
    text = sent_texts(upstream_calls(fake)[-1])
    assert "Weather in Lyon?" in text and "rain" in text and "Rain in Lyon today." in text
    assert client.responses.retrieve(second.id).output_text == "Rain in Lyon today."
