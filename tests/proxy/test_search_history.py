"""search_history end to end: the proxy offers the tool, searches the session's messages
that left the window, answers in hidden rounds and calls the model again; the client (the
official openai SDK) sees one clean answer, streaming or not."""

from __future__ import annotations

import pytest
from e2e import write_agent
from test_fetch_tool_result import (
    MODES,
    SEARCH_TOOL,
    SYSTEM,
    ask,
    first_turn,
    names_of_tools,
    search_call,
)

from proxy.testing.fake_upstream import Reply
from proxy.tools.builtin import MAX_ROUNDS
from strategies.validity import check_openai_messages

AGENT = "historian"
SECRET = "The launch code for the probe is PELICAN-42, keep it safe."


@pytest.fixture
def agent(agents_dir):
    write_agent(
        agents_dir,
        AGENT,
        llm={"model": "gpt-4o", "contextWindow": 16000},
        memoryConfig={"kind": "windowed", "windowSize": 4},
        tools=[{"name": "search"}, {"name": "search_history"}, {"name": "fetch_tool_result"}],
    )


def search_history(call_id: str = "call_h1", **arguments) -> dict:
    return {"id": call_id, "name": "search_history", "arguments": arguments}


def chat(client, fake, texts: list[str], *, stream: bool) -> None:
    """Delta turns, one user message each, answered by the fake."""
    for text in texts:
        fake.queue(Reply.text("Noted."))
        ask(client, [{"role": "user", "content": text}], stream=stream)


def hidden_results(fake, before: int) -> list[str]:
    """The tool messages the proxy added in the hidden rounds after request ``before``."""
    bodies = [r.body for r in fake.chat_requests[before:]]
    return [m["content"] for m in bodies[-1]["messages"]
            if m.get("role") == "tool" and m["tool_call_id"].startswith("call_h")]


@pytest.mark.parametrize("stream", MODES)
def test_the_model_finds_a_message_that_left_its_window(make_proxy, fake, agent, stream):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s1")
    chat(client, fake, [SECRET, "weather talk", "lunch plans", "the launch party is friday"],
         stream=stream)
    before = len(fake.chat_requests)
    fake.queue(Reply.tool_calls([search_history(query="launch code")], content="Looking."),
               Reply.text("It is PELICAN-42."))

    message, finish, _, ids = ask(client, [{"role": "user", "content": "The code?"}],
                                  stream=stream)

    assert (finish, len(ids)) == ("stop", 1)
    assert message["content"].endswith("It is PELICAN-42.")
    assert "tool_calls" not in message
    first, second = (r.body for r in fake.chat_requests[before:])
    assert SECRET not in str(first["messages"])  # trimmed from the window
    assert "the launch party is friday" in str(first["messages"])
    assert names_of_tools(first) == ["fetch_tool_result", "search_history"]
    (result,) = hidden_results(fake, before)
    lines = result.splitlines()
    assert lines[1].startswith("[seq 1, user] The launch code for the probe is PELICAN-42")
    assert len(lines) == 3  # one match: the window's own "launch party" is not searched
    assert check_openai_messages(second["messages"]) == []
    stored = proxy.stored(AGENT, "s1")
    assert not any(m.role == "tool" for m in stored)
    assert stored[-1].content == message["content"]


@pytest.mark.parametrize("stream", MODES)
def test_a_match_is_read_in_full_by_its_seq(make_proxy, fake, agent, stream):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s2")
    long = SECRET + " " + " ".join(f"detail-{i}" for i in range(200))
    chat(client, fake, [long, "a", "b", "c"], stream=stream)
    before = len(fake.chat_requests)
    fake.queue(Reply.tool_calls([search_history(query="pelican")]),
               Reply.tool_calls([search_history("call_h2", seq=1)]),
               Reply.text("Read it."))

    ask(client, [{"role": "user", "content": "Details?"}], stream=stream)

    excerpt, whole = hidden_results(fake, before)
    assert "detail-199" not in excerpt and "…" in excerpt
    assert whole == "[seq 1, user]\n" + long
    assert len(fake.chat_requests) == before + 3


@pytest.mark.parametrize("stream", MODES)
def test_unclear_arguments_get_a_usage_answer(make_proxy, fake, agent, stream):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s3")
    fake.queue(Reply.tool_calls([search_history(query="  ", seq="x")]),
               Reply.tool_calls([search_history("call_h2", seq=99)]), Reply.text("Ok."))
    before = len(fake.chat_requests)
    ask(client, [{"role": "user", "content": "hi"}], stream=stream)
    usage, missing = hidden_results(fake, before)
    assert usage.startswith('search_history needs {"query": "<words>"}')
    assert missing == "No message with seq 99 is stored in this session."


@pytest.mark.parametrize("stream", MODES)
def test_a_reply_mixing_search_and_client_calls_passes_only_the_client_calls(
    make_proxy, fake, agent, stream
):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s4")
    before = len(fake.chat_requests)
    fake.queue(Reply.tool_calls([search_history(query="x"), search_call("call_search_2")]))
    message, finish, _, _ = ask(client, [{"role": "user", "content": "go"}], stream=stream,
                                tools=[SEARCH_TOOL])
    assert len(fake.chat_requests) == before + 1
    assert finish == "tool_calls"
    [call] = message["tool_calls"]
    assert (call["id"], call["function"]["name"]) == ("call_search_2", "search")


@pytest.mark.parametrize("stream", MODES)
def test_the_hidden_search_rounds_are_bounded(make_proxy, fake, agent, stream):
    proxy = make_proxy()
    client = proxy.client(AGENT, "s5")
    fake.default_reply = lambda body: Reply.tool_calls(
        [search_history(f"call_h{len(body['messages'])}", query="again")])
    message, finish, _, _ = ask(client, [{"role": "user", "content": "loop"}], stream=stream)
    requests = [r.body for r in fake.chat_requests]
    assert len(requests) == 1 + MAX_ROUNDS
    assert requests[-1]["tool_choice"] == "none"
    assert names_of_tools(requests[-1]) == ["fetch_tool_result", "search_history"]
    assert (message["content"], finish) == ("", "stop")


@pytest.mark.parametrize("stream", MODES)
def test_an_evicted_result_in_the_window_is_searched_by_its_original(
    make_proxy, fake, agents_dir, stream
):
    write_agent(agents_dir, "fetcher", llm={"model": "gpt-4o", "contextWindow": 16000},
                memoryConfig={"kind": "auto_compact",
                              "toolResultEviction": {"afterTurns": 1, "aboveTokens": 500}},
                tools=[{"name": "search"}, {"name": "search_history"}])
    proxy = make_proxy()
    client = proxy.client("fetcher", "s7")
    history = first_turn(client, fake, stream=stream)
    history.append({"role": "user", "content": "Which capital?"})
    before = len(fake.chat_requests)
    fake.queue(Reply.tool_calls([search_history(query="capital")]), Reply.text("Poseidonia."))
    ask(client, history, stream=stream, tools=[SEARCH_TOOL])
    sent = fake.chat_requests[before].body["messages"]
    evicted = next(m for m in sent if m.get("tool_call_id") == "call_search_1")
    assert "Poseidonia" not in evicted["content"]
    (result,) = hidden_results(fake, before)
    assert result.splitlines()[1].startswith(
        "[seq 3, tool] ATLANTIS DOSSIER: the capital is Poseidonia.")
    assert SYSTEM["content"] not in result


def test_an_agent_that_does_not_list_it_is_not_offered_it(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "plain", memoryConfig={"kind": "windowed", "windowSize": 4})
    proxy = make_proxy()
    ask(proxy.client("plain", "s"), [{"role": "user", "content": "hi"}], stream=False)
    assert "tools" not in fake.chat_requests[-1].body


def test_a_client_tool_of_the_same_name_stays_the_clients(make_proxy, fake, agent):
    proxy = make_proxy()
    own = {"type": "function", "function": {"name": "search_history", "parameters": {
        "type": "object", "properties": {}}}}
    fake.queue(Reply.tool_calls([search_history(query="mine")]))
    message, finish, _, _ = ask(proxy.client(AGENT, "s6"), [{"role": "user", "content": "hi"}],
                                stream=False, tools=[own])
    assert finish == "tool_calls"
    assert message["tool_calls"][0]["function"]["name"] == "search_history"
    assert names_of_tools(fake.chat_requests[-1].body) == ["search_history", "fetch_tool_result"]
