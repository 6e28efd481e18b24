"""The Responses surface's pure translations: input items to chat-format records and
back, replies and streams both ways, a request's options for either kind of upstream."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.errors import BadRequest
from proxy.surfaces.chat_reply import ReplyAccumulator
from proxy.surfaces.responses_items import parse_input, to_items
from proxy.surfaces.responses_reply import (
    completion_from_response,
    output_items,
    response_object,
)
from proxy.surfaces.responses_request import ResponsesRequest, chat_body
from proxy.surfaces.responses_stream import ChunkReader, EventWriter
from proxy.turn.history_sync import fingerprint
from proxy.upstreams.base import UpstreamRequest
from proxy.upstreams.responses_http import chat_request, responses_body

REASONING = {"type": "reasoning", "id": "rs_1", "summary": [],
             "encrypted_content": "gAAAA+/opaque=="}
WEB_SEARCH = {"type": "web_search_call", "id": "ws_1", "status": "completed",
              "action": {"type": "search", "query": "weather"}}
CONVERSATION: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": "Be terse."},
    {"role": "user", "content": [
        {"type": "input_text", "text": "Look at this"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "low"},
        {"type": "input_file", "file_data": "data:application/pdf;base64,JVBE",
         "filename": "a.pdf"},
    ]},
    REASONING,
    {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "found"},
    WEB_SEARCH,
    {"type": "message", "role": "assistant", "id": "msg_1",
     "content": [{"type": "output_text", "text": "Done.", "annotations": []}]},
]


def test_items_become_chat_records_with_native_parts_for_what_chat_cannot_hold():
    system, conversation = parse_input(CONVERSATION)
    assert system == [{"role": "developer", "content": "Be terse."}]
    user, call, result, reply = conversation
    assert [p["type"] for p in user["content"]] == ["text", "image_url", "file"]
    assert user["content"][1]["image_url"] == {"url": "data:image/png;base64,iVBO",
                                               "detail": "low"}
    assert call["content"] == [{"type": "native", "api": "responses", "item": REASONING}]
    assert call["tool_calls"][0]["id"] == "call_1"
    assert result == {"role": "tool", "tool_call_id": "call_1", "content": "found"}
    assert reply["content"] == [
        {"type": "native", "api": "responses", "item": WEB_SEARCH},
        {"type": "text", "text": "Done."},
    ]


def test_records_render_back_to_the_same_items_in_order_with_native_items_byte_exact():
    system, conversation = parse_input(CONVERSATION)
    items = to_items([*system, *conversation])
    assert [i.get("type") for i in items] == [
        "message", "message", "reasoning", "function_call", "function_call_output",
        "web_search_call", "message"]
    assert orjson.dumps(items[2]) == orjson.dumps(REASONING)
    assert items[5] is WEB_SEARCH or items[5] == WEB_SEARCH
    assert items[-1]["content"][0] == {"type": "output_text", "text": "Done.",
                                       "annotations": []}
    assert items[1]["content"][1]["type"] == "input_image"


def test_a_resent_reply_has_the_fingerprint_of_the_stored_one_without_its_reasoning():
    stored = completion_from_response({"output": [
        REASONING, {"type": "message", "content": [{"type": "output_text", "text": "Hi."}]}]})
    message = stored["choices"][0]["message"]
    _, [resent] = parse_input([{**REASONING, "summary": [{"type": "summary_text", "text": "x"}]},
                               {"role": "assistant", "content": "Hi."}])
    assert fingerprint(message) == fingerprint(resent) == fingerprint(
        {"role": "assistant", "content": "Hi."})


def test_a_chat_only_upstream_gets_no_native_parts():
    system, conversation = parse_input(CONVERSATION)
    body = chat_request(UpstreamRequest({"messages": [*system, *conversation]})).body
    assert "native" not in orjson.dumps(body).decode()
    assert body["messages"][2] == {
        "role": "assistant", "content": "",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "lookup", "arguments": "{}"}}]}
    assert body["messages"][-1]["content"] == "Done."


def test_a_responses_reply_reads_as_a_completion_and_renders_back():
    response = {
        "id": "resp_up", "model": "gpt-5", "status": "completed", "output": [
            REASONING,
            {"type": "message", "content": [{"type": "output_text", "text": "Let me check."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_2", "name": "lookup",
             "arguments": '{"q":1}'},
        ],
        "usage": {"input_tokens": 100, "output_tokens": 20,
                  "input_tokens_details": {"cached_tokens": 64},
                  "output_tokens_details": {"reasoning_tokens": 12}},
    }
    completion = completion_from_response(response)
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert completion["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}
    out = response_object({"model": "gpt-5"}, "resp_proxy", completion)
    assert [i["type"] for i in out["output"]] == ["reasoning", "message", "function_call"]
    assert out["output"][0] == REASONING
    assert out["usage"]["input_tokens_details"]["cached_tokens"] == 64
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] == 12


@pytest.mark.parametrize("response", [
    pytest.param({"status": "failed", "output": [], "error": {"message": "boom"}}, id="failed"),
    pytest.param({"object": "chat.completion"}, id="not-a-response"),
])
def test_a_failed_or_foreign_upstream_reply_is_an_upstream_error(response):
    from proxy.errors import UpstreamReplyError

    with pytest.raises(UpstreamReplyError):
        completion_from_response(response)


def events_of(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: ")]


def test_an_upstream_event_stream_reads_as_chunks_and_writes_back_as_events():
    from proxy.testing.fake_responses import _ResponsesReply
    from proxy.testing.fake_upstream import Reply

    reply = Reply.tool_calls([{"id": "call_3", "name": "lookup", "arguments": {"q": "x"}}],
                             content="Checking.")
    upstream = events_of(b"".join(_ResponsesReply(reply, {}, 10, True).chunks(True)))
    reader, accumulator = ChunkReader(), ReplyAccumulator()
    writer = EventWriter({"model": "m"}, "resp_abc", "m")
    written = [writer.start()]
    for event in upstream:
        for chunk in reader.read(event):
            accumulator.add_chunk(chunk)
            written.append(writer.feed(chunk))
    written.append(writer.complete())
    message = accumulator.message()
    assert message is not None and accumulator.finish_reason == "tool_calls"
    assert message["content"][0]["item"]["type"] == "reasoning"
    assert message["content"][1] == {"type": "text", "text": "Checking."}
    assert message["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q":"x"}'}
    events = events_of(b"".join(written))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][2]["arguments"] == '{"q":"x"}'
    # each item opened is closed, in order
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2]


def test_request_options_map_to_chat_and_back_to_responses():
    request = ResponsesRequest.parse({
        "model": "gpt-4o", "instructions": "Be terse.", "input": "hi", "store": False,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
                  {"type": "web_search"}],
        "tool_choice": {"type": "function", "name": "f"}, "max_output_tokens": 50,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": True}},
        "reasoning": {"effort": "low", "summary": "auto"}, "include": ["x"],
        "parallel_tool_calls": False,
    })
    assert request.system == [{"role": "system", "content": "Be terse."}]
    assert request.store is False
    body = chat_body(request)
    assert body["tools"] == [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert body["max_tokens"] == 50 and body["reasoning_effort"] == "low"
    assert body["response_format"]["json_schema"]["name"] == "x"
    assert body["parallel_tool_calls"] is False
    native = responses_body({**body, "messages": [{"role": "user", "content": "hi"}],
                             "x-memory-responses": request.options()}, stream=True)
    assert native["tools"][0] == {"type": "web_search"}
    assert native["tools"][1]["name"] == "f"
    assert native["tool_choice"] == {"type": "function", "name": "f"}
    assert native["max_output_tokens"] == 50 and "max_tokens" not in native
    assert native["reasoning"] == {"effort": "low", "summary": "auto"}
    assert native["include"] == ["x"] and native["store"] is False and native["stream"] is True
    assert native["input"] == [{"type": "message", "role": "user", "content": "hi"}]


def test_an_output_item_of_a_builtin_call_sent_by_the_client_is_kept_for_its_turn():
    call = {"type": "computer_call", "call_id": "c1", "action": {"type": "screenshot"}}
    item = {"type": "computer_call_output", "call_id": "c1", "output": {"type": "x"}}
    _, [reply, message] = parse_input([call, item])
    assert message["role"] == "user" and message["content"][0]["item"] == item
    assert to_items([reply, message]) == [call, item]


def test_output_items_of_a_plain_reply():
    assert output_items({"role": "assistant", "content": "Hi."}, "x") == [{
        "type": "message", "id": "msg_x_0", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": "Hi.", "annotations": [],
                     "logprobs": []}]}]


def test_an_input_part_of_an_unknown_shape_is_refused():
    with pytest.raises(BadRequest):
        parse_input([{"role": "user", "content": [{"type": "input_text"}]}])


class _NoEndpoint:
    """A direct upstream whose /responses answers 404 with ``body``."""

    base_url = "http://upstream.test/v1"

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.chats = 0

    async def post(self, path: str, request: UpstreamRequest) -> Any:
        from proxy.errors import UpstreamStatusError

        raise UpstreamStatusError("404", status_code=404, body=self.body,
                                  content_type="application/json")

    async def chat(self, request: UpstreamRequest) -> Any:
        from proxy.upstreams.base import UpstreamResponse

        self.chats += 1
        return UpstreamResponse(200, b"{}")


@pytest.mark.parametrize("body, chat_only", [
    pytest.param(b'{"error": {"message": "no route", "type": "not_found_error", '
                 b'"param": null, "code": null}}', True, id="no-route"),
    pytest.param(b'{"detail": "Not Found"}', True, id="framework-404"),
    pytest.param(b'{"error": {"message": "The model x does not exist", '
                 b'"type": "invalid_request_error", "param": "model", '
                 b'"code": "model_not_found"}}', False, id="unknown-model"),
])
async def test_only_a_404_of_the_path_makes_an_upstream_chat_only(body, chat_only):
    from proxy.errors import UpstreamStatusError
    from proxy.upstreams.responses_http import ResponsesUpstream

    direct = _NoEndpoint(body)
    upstream = ResponsesUpstream(direct)  # type: ignore[arg-type]
    request = UpstreamRequest({"model": "x", "messages": [{"role": "user", "content": "hi"}]})
    if chat_only:
        await upstream.chat(request)
        assert upstream.chat_only and direct.chats == 1
    else:
        with pytest.raises(UpstreamStatusError):
            await upstream.chat(request)
        assert not upstream.chat_only and direct.chats == 0


class _Reads:
    """An upstream stream whose reads bring the given groups of events."""

    status_code = 200
    headers: dict[str, str] = {}

    def __init__(self, reads: list[list[dict[str, Any]]]) -> None:
        from proxy.upstreams.base import SSEEvent

        self.reads = [[SSEEvent(b"data: " + orjson.dumps(e) + b"\n\n", orjson.dumps(e))
                       for e in read] for read in reads]
        self.pending: list[Any] = []

    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> Any:
        if not self.pending:
            if not self.reads:
                raise StopAsyncIteration
            self.pending = self.reads.pop(0)
        return self.pending.pop(0)

    def ready(self) -> list[Any]:
        out, self.pending = self.pending, []
        return out

    async def aclose(self) -> None:
        pass


async def test_a_translated_stream_hands_over_what_one_read_brought_together():
    from proxy.upstreams.responses_http import _TranslatedStream

    delta = {"type": "response.output_text.delta", "item_id": "m", "delta": "a"}
    stream = _TranslatedStream(_Reads([
        [{"type": "response.created", "response": {"id": "r", "model": "m"}}, delta, delta],
        [delta, {"type": "response.completed", "response": {"output": []}}],
    ]))
    events = aiter(stream)
    first = await anext(events)
    together = stream.ready()
    assert [orjson.loads(e.data)["choices"][0]["delta"] for e in [first, *together]] == [
        {"role": "assistant", "content": ""}, {"content": "a"}, {"content": "a"}]
    rest = [e async for e in events]
    assert rest[-1].done and len(rest) == 3  # the delta, the finish (no usage), [DONE]


def test_a_namespaced_function_call_keeps_its_namespace_for_a_responses_upstream_only():
    call = {"type": "function_call", "call_id": "call_ns", "name": "close_agent",
            "namespace": "multi_agent_v1", "arguments": "{}"}
    _, conversation = parse_input([{"role": "user", "content": "go"}, call,
                                   {"type": "function_call_output", "call_id": "call_ns",
                                    "output": "closed"}])
    assert to_items(conversation)[1] == call
    chat = chat_request(UpstreamRequest({"messages": conversation})).body["messages"]
    assert "namespace" not in chat[1]["tool_calls"][0]
    reader, accumulator = ChunkReader(), ReplyAccumulator()
    for event in [{"type": "response.output_item.added", "item": {**call, "id": "fc_1"}},
                  {"type": "response.completed", "response": {"output": [call]}}]:
        for chunk in reader.read(event):
            accumulator.add_chunk(chunk)
    message = accumulator.message()
    assert message is not None and message["tool_calls"][0]["namespace"] == "multi_agent_v1"
    assert output_items(message, "x")[0]["namespace"] == "multi_agent_v1"


def test_a_builtin_calls_output_is_not_sent_without_its_call():
    call = {"type": "custom_tool_call", "call_id": "ct_1", "name": "apply_patch", "input": "x"}
    output = {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "done"}
    _, conversation = parse_input([{"role": "user", "content": "go"}, call, output,
                                   {"role": "user", "content": "next"}])
    assert [i["type"] for i in to_items(conversation)] == [
        "message", "custom_tool_call", "custom_tool_call_output", "message"]
    # a window that starts after the call
    assert [i["type"] for i in to_items(conversation[2:])] == ["message"]
