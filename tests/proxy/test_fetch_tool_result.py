"""fetch_tool_result end to end: the proxy offers the tool, answers it from the store and
calls the model again; the client (the official openai SDK) sees one clean answer."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import orjson
import pytest
from e2e import CLIENT_KEY, write_agent

from proxy.surfaces.chat_reply import ReplyAccumulator
from proxy.testing.fake_upstream import Reply
from proxy.tools.builtin import MAX_ROUNDS, Offered
from proxy.tools.fetch_tool import FETCH_TOOL, TOOL_DEFINITION
from proxy.tools.stream import FetchStream
from proxy.upstreams.base import SSEEvent, UpstreamRequest
from strategies.records import SessionKey, StoredMessage
from strategies.summary_prompt import SUMMARY_SYSTEM_PROMPT
from strategies.validity import check_openai_messages

AGENT = "fetcher"
SYSTEM = {"role": "system", "content": "You research things."}
SEARCH_TOOL = {
    "type": "function",
    "function": {"name": "search", "parameters": {"type": "object", "properties": {}}},
}
BIG_RESULT = "ATLANTIS DOSSIER: the capital is Poseidonia. " + " ".join(
    f"filler-{i}" for i in range(600)
)
MODES = [pytest.param(False, id="non-streaming"), pytest.param(True, id="streaming")]


@pytest.fixture
def agent(agents_dir):
    write_agent(
        agents_dir,
        AGENT,
        llm={"model": "gpt-4o", "contextWindow": 16000},
        memoryConfig={
            "kind": "auto_compact",
            "toolResultEviction": {"afterTurns": 1, "aboveTokens": 500},
        },
        tools=[{"name": "search"}, {"name": "fetch_tool_result"}],
    )
    write_agent(
        agents_dir,
        "plain",
        memoryConfig={"kind": "auto_compact", "toolResultEviction": {"afterTurns": 1}},
    )


def fetch_call(call_id: str = "call_fetch_1", wanted: str = "call_search_1") -> dict:
    return {"id": call_id, "name": "fetch_tool_result", "arguments": {"tool_call_id": wanted}}


def search_call(call_id: str = "call_search_1") -> dict:
    return {"id": call_id, "name": "search", "arguments": {"q": "atlantis"}}


def ask(client, messages, *, stream: bool, **kwargs):
    """One request; returns (the assistant message as the client assembled it, finish
    reason, usage, chunk ids)."""
    if not stream:
        reply = client.chat.completions.create(model="gpt-4o", messages=messages, **kwargs)
        message = reply.choices[0].message.model_dump(exclude_none=True)
        return message, reply.choices[0].finish_reason, reply.usage, {reply.id}
    chunks = list(client.chat.completions.create(
        model="gpt-4o", messages=messages, stream=True,
        stream_options={"include_usage": True}, **kwargs,
    ))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or delta.id
            call["name"] += delta.function.name or "" if delta.function else ""
            call["arguments"] += delta.function.arguments or "" if delta.function else ""
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ]
        assert sorted(calls) == list(range(len(calls))), "tool call indices have gaps"
    finishes = [c.choices[0].finish_reason for c in chunks
                if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1, finishes
    usage = next((c.usage for c in chunks if c.usage), None)
    return message, finishes[0], usage, {c.id for c in chunks}


def first_turn(client, fake, *, stream: bool = False) -> list[dict]:
    """Turn 1: the model calls the client's search tool, which returns a big result.
    Returns the full history the client holds afterwards."""
    fake.queue(Reply.tool_calls([search_call()]), Reply.text("Found the dossier."))
    history = [SYSTEM, {"role": "user", "content": "Find the Atlantis dossier."}]
    message, _, _, _ = ask(client, history, stream=stream, tools=[SEARCH_TOOL])
    history += [message, {"role": "tool", "tool_call_id": "call_search_1",
                          "content": BIG_RESULT}]
    message, _, _, _ = ask(client, history, stream=stream, tools=[SEARCH_TOOL])
    return [*history, message]


def always_fetch(body: dict) -> Reply:
    return Reply.tool_calls([fetch_call(f"call_f{len(body['messages'])}")])


def names_of_tools(body: dict) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]


@pytest.mark.parametrize("stream", MODES)
def test_a_fetch_round_trip_is_invisible_to_the_client(make_proxy, fake, agent, stream):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s1")
    history = first_turn(client, fake, stream=stream)
    history.append({"role": "user", "content": "What is the capital, exactly?"})
    before = len(fake.chat_requests)
    fake.queue(Reply.tool_calls([fetch_call()], content="Let me check."),
               Reply.text("The capital is Poseidonia."))

    message, finish, usage, ids = ask(client, history, stream=stream, tools=[SEARCH_TOOL])

    assert "tool_calls" not in message
    assert finish == "stop"
    assert len(ids) == 1  # one completion id, however many rounds ran
    expected = "The capital is Poseidonia."
    # a stream already carried the first round's words; a whole reply is the last round's
    assert message["content"] == ("Let me check.\n\n" + expected if stream else expected)
    first, second = (r.body for r in fake.chat_requests[before:])
    assert len(fake.chat_requests) == before + 2
    # the evicted result went out as a stub, the tool was offered after the client's own
    evicted = next(m for m in first["messages"] if m.get("tool_call_id") == "call_search_1")
    assert "fetch_tool_result" in evicted["content"] and BIG_RESULT not in evicted["content"]
    assert names_of_tools(first) == ["search", "fetch_tool_result"]
    # the hidden round: the call and the original content
    call, result = second["messages"][-2:]
    assert call["tool_calls"][0]["function"]["name"] == "fetch_tool_result"
    assert result == {"role": "tool", "tool_call_id": "call_fetch_1", "content": BIG_RESULT}
    for body in (first, second):
        assert check_openai_messages(body["messages"]) == []
    # usage covers both rounds
    assert usage.prompt_tokens == sum(
        fake.count_tokens(body) for body in (first, second))
    # the store holds what the client saw, not the hidden exchange
    stored = proxy.stored(AGENT, "s1")
    assert stored[-1].role == "assistant" and stored[-1].content == message["content"]
    assert not any(m.tool_call_id == "call_fetch_1" for m in stored)
    assert not any(
        c["function"]["name"] == "fetch_tool_result" for m in stored for c in m.tool_calls or ()
    )


@pytest.mark.parametrize("stream", MODES)
def test_a_full_history_client_continues_after_a_hidden_round(make_proxy, fake, agent, stream):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s2")
    history = first_turn(client, fake, stream=stream)
    history.append({"role": "user", "content": "Capital?"})
    fake.queue(Reply.tool_calls([fetch_call()]), Reply.text("Poseidonia."))
    message, _, _, _ = ask(client, history, stream=stream)
    history += [message, {"role": "user", "content": "Thanks."}]
    count = len(proxy.stored(AGENT, "s2"))
    ask(client, history, stream=stream)
    stored = proxy.stored(AGENT, "s2")
    # the resent history matched the log: only the new user message and the reply were added
    assert len(stored) == count + 2
    assert [m.content for m in stored[-3:]] == ["Poseidonia.", "Thanks.", stored[-1].content]
    assert check_openai_messages(fake.chat_requests[-1].body["messages"]) == []


def test_the_stream_ends_with_a_single_done(make_proxy, fake, agent):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s3")
    history = first_turn(client, fake)
    history.append({"role": "user", "content": "Capital?"})
    fake.queue(Reply.tool_calls([fetch_call()]), Reply.text("Poseidonia."))
    body = {"model": "gpt-4o", "messages": history, "stream": True}
    response = httpx.post(f"{proxy.url(AGENT, 's3')}/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=20)
    events = [e for e in response.text.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    assert response.text.count("[DONE]") == 1
    chunks = [orjson.loads(e[len("data: "):]) for e in events[:-1]]
    assert "usage" not in {k for c in chunks if c.get("usage") for k in c}  # not asked for
    assert not any(c["choices"][0]["delta"].get("tool_calls") for c in chunks if c["choices"])
    assert [c["choices"][0]["delta"]["role"] for c in chunks
            if c["choices"] and c["choices"][0]["delta"].get("role")] == ["assistant"]


@pytest.mark.parametrize("stream", MODES)
def test_an_unknown_tool_call_id_gets_a_clear_not_found_answer(make_proxy, fake, agent, stream):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s4")
    fake.queue(Reply.tool_calls([fetch_call(wanted="call_nowhere")]), Reply.text("Sorry."))
    message, _, _, _ = ask(client, [SYSTEM, {"role": "user", "content": "hi"}], stream=stream)
    assert message["content"] == "Sorry."
    result = fake.chat_requests[-1].body["messages"][-1]
    assert result["role"] == "tool"
    assert 'No tool result with tool_call_id="call_nowhere"' in result["content"]


@pytest.mark.parametrize("stream", MODES)
def test_a_result_of_another_session_is_never_fetched(make_proxy, fake, agent, stream):
    proxy = make_proxy()
    first_turn(proxy.client(AGENT, "owner"), fake)
    fake.queue(Reply.tool_calls([fetch_call()]), Reply.text("Nothing."))
    ask(proxy.client(AGENT, "other"), [{"role": "user", "content": "peek"}], stream=stream)
    assert BIG_RESULT not in fake.chat_requests[-1].body["messages"][-1]["content"]


@pytest.mark.parametrize("stream", MODES)
def test_a_reply_mixing_fetch_and_client_calls_passes_only_the_client_calls(
    make_proxy, fake, agent, stream
):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s5")
    history = first_turn(client, fake, stream=stream)
    history.append({"role": "user", "content": "Search again and compare."})
    before = len(fake.chat_requests)
    fake.queue(Reply.tool_calls([fetch_call(), search_call("call_search_2")]))

    message, finish, _, _ = ask(client, history, stream=stream, tools=[SEARCH_TOOL])

    assert len(fake.chat_requests) == before + 1  # no hidden round for a mixed reply
    assert finish == "tool_calls"
    [call] = message["tool_calls"]
    assert (call["id"], call["function"]["name"]) == ("call_search_2", "search")
    # the client answers its call; the dropped fetch call never shows up in the history
    fake.queue(Reply.text("Compared."))
    history += [message, {"role": "tool", "tool_call_id": "call_search_2", "content": "two"}]
    answer, _, _, _ = ask(client, history, stream=stream, tools=[SEARCH_TOOL])
    assert answer["content"] == "Compared."
    sent = fake.chat_requests[-1].body["messages"]
    assert check_openai_messages(sent) == []
    assert "call_fetch_1" not in orjson.dumps(sent).decode()
    stored_calls = [c["id"] for m in proxy.stored(AGENT, "s5") for c in m.tool_calls or ()]
    assert stored_calls == ["call_search_1", "call_search_2"]


@pytest.mark.parametrize("stream", MODES)
def test_the_hidden_rounds_are_bounded(make_proxy, fake, agent, stream):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s6")
    fake.default_reply = always_fetch
    message, finish, _, _ = ask(client, [SYSTEM, {"role": "user", "content": "loop"}],
                                stream=stream)
    requests = [r.body for r in fake.chat_requests]
    assert len(requests) == 1 + MAX_ROUNDS
    # the request after the last hidden round no longer lets the model call the tool
    assert requests[-1]["tool_choice"] == "none"
    assert all("tool_choice" not in body for body in requests[:-1])
    # a fetch call that still comes back is dropped: the client gets a plain, empty answer
    assert "tool_calls" not in message
    assert (message["content"], finish) == ("", "stop")
    stored = proxy.stored(AGENT, "s6")
    assert [(m.role, m.content, m.tool_calls) for m in stored] == [
        ("user", "loop", None), ("assistant", "", None)]


def test_after_the_last_round_the_clients_own_tools_stay_callable(make_proxy, fake, agent):
    proxy = make_proxy()
    fake.default_reply = always_fetch
    ask(proxy.client(AGENT, "s7"), [{"role": "user", "content": "x"}], stream=False,
        tools=[SEARCH_TOOL])
    last = fake.chat_requests[-1].body
    assert names_of_tools(last) == ["search"]
    assert "tool_choice" not in last


def test_the_tool_is_offered_only_to_agents_that_enable_it(make_proxy, fake, agent):
    proxy = make_proxy()
    proxy.client("plain", "p").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert "tools" not in fake.chat_requests[-1].body
    proxy.client(AGENT, "p").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    body = fake.chat_requests[-1].body
    assert names_of_tools(body) == ["fetch_tool_result"]
    assert body["tools"][0]["function"]["parameters"]["required"] == ["tool_call_id"]
    assert "tool_choice" not in body


def test_a_client_that_declares_its_own_fetch_tool_result_keeps_it(make_proxy, fake, agent):
    proxy = make_proxy()
    own = {"type": "function", "function": {"name": "fetch_tool_result", "parameters": {}}}
    fake.queue(Reply.tool_calls([fetch_call()]))
    reply = proxy.client(AGENT, "own").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], tools=[own])
    assert reply.choices[0].message.tool_calls[0].function.name == "fetch_tool_result"
    assert fake.chat_requests[-1].body["tools"] == [own]
    assert len(fake.chat_requests) == 1


def test_x_memory_off_never_offers_the_tool(make_proxy, fake, agent):
    proxy = make_proxy()
    proxy.client(AGENT, "off", default_headers={"X-Memory": "off"}).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert "tools" not in fake.chat_requests[-1].body


@pytest.mark.parametrize("stream", MODES)
def test_a_hidden_round_that_fails_upstream_is_an_error_and_stores_nothing(
    make_proxy, fake, agent, stream
):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s8")
    fake.queue(Reply.tool_calls([fetch_call()]), Reply.error(503))
    if stream:
        import openai

        with pytest.raises(openai.APIError):
            ask(client, [{"role": "user", "content": "hi"}], stream=True)
    else:
        with pytest.raises(Exception) as caught:
            ask(client, [{"role": "user", "content": "hi"}], stream=False)
        assert getattr(caught.value, "status_code", None) == 503
    assert proxy.stored(AGENT, "s8") == []


def test_the_summarizer_is_never_offered_the_tool(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "tiny", llm={"model": "gpt-4o", "contextWindow": 1000},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.5},
                tools=[{"name": "fetch_tool_result"}])
    proxy = make_proxy()
    proxy.client("tiny", "t").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "word " * 700}])
    proxy.drain()
    summarizer = [r.body for r in fake.chat_requests
                  if r.body["messages"][0]["content"].startswith(SUMMARY_SYSTEM_PROMPT)]
    assert summarizer  # one call, or several when the input takes chunks
    assert all("tools" not in body for body in summarizer)


# ---- the stream filter on scripted upstream streams (no server) ----


class ScriptedStream:
    """An ``UpstreamStream`` that yields the given chunks, then ``[DONE]``."""

    status_code = 200
    headers: dict = {}

    def __init__(self, *chunks: dict) -> None:
        self.events = [SSEEvent(b"data: " + orjson.dumps(c) + b"\n\n", orjson.dumps(c))
                       for c in chunks] + [SSEEvent(b"data: [DONE]\n\n", b"[DONE]")]
        self.closed = False

    def __aiter__(self):
        return self._events()

    async def _events(self):
        for event in self.events:
            yield event

    async def aclose(self) -> None:
        self.closed = True


class ScriptedUpstream:
    def __init__(self, *streams: ScriptedStream) -> None:
        self.streams, self.requests = list(streams), []

    async def chat_stream(self, request):
        self.requests.append(request)
        return self.streams.pop(0)


class OneResultStore:
    async def find_tool_result(self, key, tool_call_id):
        if tool_call_id == "call_search_1":
            return StoredMessage(role="tool", content="ORIGINAL", tool_call_id=tool_call_id)
        return None


def chunk(delta: dict | None = None, finish: str | None = None, *, id: str = "up-1",
          usage: dict | None = None) -> dict:
    if delta is None and finish is None:
        return {"id": id, "choices": [], "usage": usage}
    return {"id": id, "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
            "usage": usage}


def call_delta(index: int | None, *, id: str | None = None, name: str | None = None,
               arguments: str = "") -> dict:
    delta: dict = {"function": {"arguments": arguments}}
    if index is not None:
        delta["index"] = index
    if id:
        delta["id"], delta["type"] = id, "function"
    if name:
        delta["function"]["name"] = name
    return delta


async def relayed(*rounds: ScriptedStream) -> tuple[list[dict], ScriptedUpstream, FetchStream]:
    upstream = ScriptedUpstream(*rounds[1:])
    services = SimpleNamespace(store=OneResultStore(), upstream=upstream)
    request = UpstreamRequest({"model": "m", "messages": [{"role": "user", "content": "q"}],
                               "tools": [TOOL_DEFINITION], "stream": True})
    offered = Offered((FETCH_TOOL,), SessionKey("ns", AGENT, "s"))
    stream = FetchStream(services, offered, request, rounds[0])
    events = [event async for event in stream]
    assert events[-1].done and sum(e.done for e in events) == 1
    return [orjson.loads(e.data) for e in events[:-1]], upstream, stream


def client_calls(chunks: list[dict]) -> dict[int, dict]:
    accumulator = ReplyAccumulator()
    for item in chunks:
        accumulator.add_chunk(item)
    message = accumulator.message() or {}
    return {i: c for i, c in enumerate(message.get("tool_calls") or [])}


async def test_a_call_whose_name_arrives_late_is_held_then_renumbered_for_the_client():
    chunks, upstream, _ = await relayed(ScriptedStream(
        chunk({"role": "assistant", "content": ""}),
        chunk({"tool_calls": [call_delta(0, id="f1", name="fetch_tool_result",
                                         arguments='{"tool_call_id":')]}),
        chunk({"tool_calls": [call_delta(1, id="s1", arguments='{"q"')]}),  # no name yet
        chunk({"tool_calls": [call_delta(1, name="search", arguments=":1}")]}),
        chunk({"tool_calls": [call_delta(0, arguments='"x"}')]}),
        chunk(finish="tool_calls"),
    ))
    assert upstream.requests == []  # a mixed reply runs no hidden round
    deltas = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get(
        "tool_calls", [])]
    assert {d["index"] for d in deltas} == {0}
    assert client_calls(chunks) == {0: {"id": "s1", "type": "function",
                                        "function": {"name": "search", "arguments": '{"q":1}'}}}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


async def test_calls_without_an_index_are_told_apart_by_their_ids():
    chunks, _, _ = await relayed(ScriptedStream(
        chunk({"tool_calls": [call_delta(None, id="s1", name="search", arguments="{}")]}),
        chunk({"tool_calls": [call_delta(None, id="f1", name="fetch_tool_result",
                                         arguments='{"tool_call_id":"x"}')]}),
        chunk(finish="tool_calls"),
    ))
    assert [c["function"]["name"] for c in client_calls(chunks).values()] == ["search"]


async def test_a_hidden_round_continues_the_same_stream():
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105}
    chunks, upstream, stream = await relayed(
        ScriptedStream(
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Checking"}),
            chunk({"tool_calls": [call_delta(0, id="f1", name="fetch_tool_result",
                                             arguments='{"tool_call_id":"call_search_1"}')]}),
            chunk(finish="tool_calls"),
            chunk(usage=usage),
        ),
        ScriptedStream(
            chunk({"role": "assistant", "content": ""}, id="up-2"),
            chunk({"content": "Found it."}, id="up-2"),
            chunk(finish="stop", id="up-2"),
            chunk(usage={"prompt_tokens": 300, "completion_tokens": 7, "total_tokens": 307},
                  id="up-2"),
        ),
    )
    assert {c["id"] for c in chunks} == {"up-1"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Checking\n\nFound it."
    assert [c["choices"][0]["delta"].get("role") for c in chunks if c["choices"]].count(
        "assistant") == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"]] == ["stop"]
    assert [c["usage"] for c in chunks if c.get("usage")] == [
        {"prompt_tokens": 400, "completion_tokens": 12, "total_tokens": 412}]
    assert stream.memory_usage == {"prompt_tokens": 100}
    [second] = upstream.requests
    assert second.body["messages"][-2:] == [
        {"role": "assistant", "content": "Checking", "tool_calls": [
            {"id": "f1", "type": "function", "function": {
                "name": "fetch_tool_result", "arguments": '{"tool_call_id":"call_search_1"}'}}]},
        {"role": "tool", "tool_call_id": "f1", "content": "ORIGINAL"},
    ]
