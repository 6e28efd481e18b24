"""The SSE parser and the reply accumulator."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.surfaces.chat_reply import ReplyAccumulator
from proxy.upstreams.base import SSEEvent
from proxy.upstreams.sse import SSEParser, _data_of, parse_sse

# ---- SSE parser ----

_line_text = st.text(
    st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20
)


@st.composite
def sse_streams(draw: st.DrawFn) -> bytes:
    """A stream of events: data lines (one or several), comments, other fields, with LF,
    CRLF or mixed line endings."""
    newline = draw(st.sampled_from(["\n", "\r\n", "mixed"]))
    events = []
    for _ in range(draw(st.integers(0, 6))):
        lines = draw(st.lists(st.one_of(
            _line_text.map(lambda t: f"data: {t}"),
            _line_text.map(lambda t: f"data:{t}"),
            _line_text.map(lambda t: f": {t}"),
            st.just("event: message"),
            st.just("data: [DONE]"),
        ), min_size=1, max_size=4))

        def end() -> str:
            return draw(st.sampled_from(["\n", "\r\n"])) if newline == "mixed" else newline

        events.append("".join(line + end() for line in lines) + end())
    return "".join(events).encode()


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return [p for p in pieces if p]


@given(sse_streams(), st.lists(st.integers(0, 400), max_size=30))
def test_parser_yields_the_same_events_for_any_split_of_the_stream(
    stream: bytes, cuts: list[int]
) -> None:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for piece in _split(stream, cuts):
        events.extend(parser.feed(piece))
    events.extend(parser.flush())

    assert events == parse_sse(stream)
    assert b"".join(e.raw for e in events) == stream
    # each event's data is what the general rule reads from its block
    blocks = re.split(rb"\r\n\r\n|\n\n|\n\r\n|\r\n\n", stream)[:-1]
    assert [e.data for e in events] == [_data_of(block) for block in blocks]


def test_parser_splits_events_at_blank_lines_and_keeps_their_raw_bytes() -> None:
    events = parse_sse(b'data: {"a":1}\n\ndata: [DONE]\n\n')

    assert [e.raw for e in events] == [b'data: {"a":1}\n\n', b"data: [DONE]\n\n"]
    assert [e.data for e in events] == [b'{"a":1}', b"[DONE]"]
    assert events[1].done and not events[0].done


def test_parser_joins_multi_line_data_with_newlines() -> None:
    (event,) = parse_sse(b"event: x\ndata: first\ndata:second\nid: 3\n\n")

    assert event.data == b"first\nsecond"


def test_parser_understands_crlf_line_endings() -> None:
    events = parse_sse(b"data: one\r\n\r\ndata: two\r\ndata: more\r\n\r\n")

    assert [e.data for e in events] == [b"one", b"two\nmore"]


def test_a_comment_only_event_is_returned_with_empty_data() -> None:
    (ping, event) = parse_sse(b": ping\n\ndata: x\n\n")

    assert ping.raw == b": ping\n\n" and ping.data == b""
    assert event.data == b"x"


def test_an_event_arriving_byte_by_byte_is_returned_once_complete() -> None:
    parser = SSEParser()
    stream = b"data: hello\n\n"

    seen = [parser.feed(stream[i : i + 1]) for i in range(len(stream))]

    assert all(not s for s in seen[:-1])
    assert seen[-1] == [SSEEvent(raw=stream, data=b"hello")]


def test_flush_returns_a_last_event_that_lacks_its_blank_line() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n\ndata: tail") == [SSEEvent(b"data: a\n\n", b"a")]

    assert parser.flush() == [SSEEvent(b"data: tail", b"tail")]
    assert parser.flush() == []


# ---- reply accumulator ----


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, index: int = 0,
          **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [
        {"index": index, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o",
            "choices": choices, **extra}


def test_text_deltas_are_concatenated_into_the_assistant_message() -> None:
    acc = ReplyAccumulator()
    for c in [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}),
              chunk({"content": "lo"}), chunk({}, "stop")]:
        acc.add_chunk(c)

    assert acc.message() == {"role": "assistant", "content": "Hello"}
    assert acc.finish_reason == "stop" and acc.complete
    assert (acc.id, acc.model) == ("chatcmpl-1", "gpt-4o")


def test_parallel_tool_calls_are_assembled_from_many_fragments() -> None:
    acc = ReplyAccumulator()
    acc.add_chunk(chunk({"role": "assistant", "content": None}))
    acc.add_chunk(chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                         "function": {"name": "search", "arguments": ""}}]}))
    for piece in ['{"q"', ': "ca', 'ts"}']:
        acc.add_chunk(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
    acc.add_chunk(chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                         "function": {"name": "fetch", "arguments": "{"}}]}))
    # fragments of both calls in one delta, out of order
    acc.add_chunk(chunk({"tool_calls": [
        {"index": 1, "function": {"arguments": '"url": 1'}},
        {"index": 0, "function": {"arguments": ""}},
    ]}))
    acc.add_chunk(chunk({"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]}))
    acc.add_chunk(chunk({}, "tool_calls"))

    assert acc.message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "search", "arguments": '{"q": "cats"}'}},
            {"id": "call_b", "type": "function",
             "function": {"name": "fetch", "arguments": '{"url": 1}'}},
        ],
    }
    assert acc.finish_reason == "tool_calls"


def test_tool_call_fragments_without_index_follow_their_ids() -> None:
    acc = ReplyAccumulator()
    for delta in [{"id": "a", "function": {"name": "f", "arguments": "{"}},
                  {"function": {"arguments": "}"}},
                  {"id": "b", "function": {"name": "g", "arguments": "[]"}}]:
        acc.add_chunk(chunk({"tool_calls": [delta]}))

    calls = acc.message()["tool_calls"]  # type: ignore[index]
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [("a", "{}"), ("b", "[]")]


def test_usage_comes_from_the_final_usage_chunk() -> None:
    acc = ReplyAccumulator()
    acc.add_chunk(chunk({"content": "hi"}, usage=None))
    acc.add_chunk(chunk({}, "stop", usage=None))
    acc.add_chunk(chunk(None, usage={"prompt_tokens": 12, "completion_tokens": 3,
                                     "total_tokens": 15}))

    assert acc.usage == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    assert (acc.prompt_tokens, acc.completion_tokens) == (12, 3)


def test_only_the_first_choice_is_kept_when_n_is_above_one() -> None:
    acc = ReplyAccumulator()
    acc.add_chunk(chunk({"content": "first"}, index=0))
    acc.add_chunk(chunk({"content": "second"}, index=1))
    acc.add_chunk(chunk({}, "length", index=1))

    assert acc.message() == {"role": "assistant", "content": "first"}
    assert not acc.complete


def test_refusal_deltas_are_kept() -> None:
    acc = ReplyAccumulator()
    acc.add_chunk(chunk({"refusal": "I can't "}))
    acc.add_chunk(chunk({"refusal": "help with that."}, "stop"))

    assert acc.message() == {"role": "assistant", "content": "",
                             "refusal": "I can't help with that."}


def test_nothing_received_gives_no_message() -> None:
    acc = ReplyAccumulator()
    acc.add_chunk(chunk({"role": "assistant", "content": ""}))

    assert acc.message() is None
    assert not acc.complete


def test_a_complete_empty_reply_is_an_empty_assistant_message() -> None:
    acc = ReplyAccumulator()
    acc.add_chunk(chunk({}, "stop"))

    assert acc.message() == {"role": "assistant", "content": ""}


def test_sse_events_are_parsed_and_done_and_comments_skipped() -> None:
    acc = ReplyAccumulator()
    stream = (b": ping\n\n" + b"data: " + orjson.dumps(chunk({"content": "x"}, "stop"))
              + b"\n\ndata: [DONE]\n\n")
    for event in parse_sse(stream):
        acc.add_event(event)

    assert acc.message() == {"role": "assistant", "content": "x"}


def test_an_error_chunk_mid_stream_is_recorded() -> None:
    acc = ReplyAccumulator()
    acc.add_chunk({"error": {"message": "overloaded", "type": "server_error"}})

    assert acc.error == {"message": "overloaded", "type": "server_error"}


@pytest.mark.parametrize("tool_calls", [
    pytest.param(None, id="text"),
    pytest.param([{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                 id="tool-calls"),
])
def test_a_non_streaming_response_gives_its_first_choice_message(
    tool_calls: list[dict[str, Any]] | None,
) -> None:
    message: dict[str, Any] = {"role": "assistant", "content": None if tool_calls else "hi",
                               "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    acc = ReplyAccumulator()
    acc.add_response({
        "id": "chatcmpl-9", "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    })

    expected: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if tool_calls:
        expected["tool_calls"] = tool_calls
    assert acc.message() == expected
    assert acc.complete and acc.usage is not None and acc.usage["prompt_tokens"] == 5
    assert acc.id == "chatcmpl-9"


def test_the_accumulator_reads_every_chunk_shape_providers_send() -> None:
    """Random streams in the shapes OpenAI and compatible servers send (``usage: null`` on
    every chunk, ``refusal: null``, a role-only first delta, tool call fragments, other
    choices, a usage-only last chunk): the reply is what the chunks say."""
    import random

    from proxy.surfaces.chat_reply import ReplyAccumulator

    rng = random.Random(3)
    for _ in range(300):
        accumulator, texts, refusals, args = ReplyAccumulator(), [], [], []
        usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        extra = {"usage": None} if rng.random() < 0.5 else {}
        base = {"id": "c1", "object": "chat.completion.chunk", "model": "m", **extra}
        chunks = [base | {"choices": [{"index": 0, "delta": {"role": "assistant"},
                                       "finish_reason": None}]}]
        for n in range(rng.randint(0, 12)):
            delta: dict = {"content": f"w{n} "} if rng.random() < 0.7 else {"content": ""}
            if rng.random() < 0.2:
                delta["refusal"] = None if rng.random() < 0.5 else f"no{n}"
            if rng.random() < 0.15:
                delta["tool_calls"] = [{"index": 0, "id": "t1" if not args else None,
                                        "function": {"name": "f", "arguments": f"a{n}"}}]
                args.append(f"a{n}")
            texts.append(delta["content"])
            if delta.get("refusal"):
                refusals.append(delta["refusal"])
            choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
            if rng.random() < 0.1:
                choices.append({"index": 1, "delta": {"content": "other"}, "finish_reason": None})
            chunks.append(base | {"choices": choices})
        chunks.append(base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        chunks.append(base | {"choices": [], "usage": usage})
        for chunk in chunks:
            accumulator.add_chunk(chunk)

        message = accumulator.message()
        content = "".join(texts)
        assert message["content"] == (content if content or not args else None)
        assert message.get("refusal") == ("".join(refusals) or None)
        if args:
            assert message["tool_calls"][0]["function"]["arguments"] == "".join(args)
        assert accumulator.usage == usage and accumulator.finish_reason == "stop"
        assert (accumulator.id, accumulator.model) == ("c1", "m")


class ReadsStream:
    """An upstream stream whose reads bring the given lists of events (``ready()`` hands
    out the rest of the current read, as ``OpenAIStream`` does)."""

    status_code, headers = 200, {}

    def __init__(self, reads: list[list[SSEEvent]]) -> None:
        self.reads = reads
        self.pending: list[SSEEvent] = []
        self.closed = False

    def __aiter__(self) -> ReadsStream:
        return self

    async def __anext__(self) -> SSEEvent:
        if not self.pending:
            if not self.reads:
                raise StopAsyncIteration
            self.pending = self.reads.pop(0)
        return self.pending.pop(0)

    def ready(self) -> list[SSEEvent]:
        taken, self.pending = self.pending, []
        return taken

    async def aclose(self) -> None:
        self.closed = True


async def test_events_that_arrive_together_are_forwarded_together() -> None:
    """One write per read of the upstream: what one read brought (``ready()``) goes out in
    one piece, in order, up to ``[DONE]``; a later read is a later piece."""
    from proxy.surfaces.chat import DONE, chat_surface
    from proxy.turn.relay import relay

    def event(text: str) -> SSEEvent:
        data = b'{"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}]}'
        return SSEEvent(b"data: " + data + b"\n\n", data)

    done = SSEEvent(b"data: [DONE]\n\n", b"[DONE]")
    stream = ReadsStream([[event("a"), event("b"), event("c")], [event("d"), done, event("late")]])
    pieces = [piece async for piece in relay(chat_surface, stream, None)]

    assert pieces == [event("a").raw + event("b").raw + event("c").raw, event("d").raw, DONE]
    assert stream.closed


async def test_events_before_a_malformed_one_in_the_same_read_are_still_forwarded() -> None:
    """Forwarding per read keeps what per event did: the events before one that cannot be
    read are sent, then the stream ends with an upstream error event."""
    from proxy.surfaces.chat import chat_surface
    from proxy.turn.relay import relay

    good = b'{"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}'
    stream = ReadsStream([[SSEEvent(b"data: " + good + b"\n\n", good),
                           SSEEvent(b"data: {not json\n\n", b"{not json")]])

    class Turn:  # relay reads the chunks only when a turn is being stored
        pass

    pieces = [piece async for piece in relay(chat_surface, stream, Turn())]
    assert pieces[0] == b"data: " + good + b"\n\n"
    assert len(pieces) == 2 and pieces[1].startswith(b"data: ")
    assert orjson.loads(pieces[1][6:])["error"]["code"] == "upstream_invalid_reply"
