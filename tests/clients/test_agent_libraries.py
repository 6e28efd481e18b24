"""Real agent libraries through the proxy, offline against the fake upstream: each keeps
its memory over a multi-turn session with tool calls (parallel ones included), streaming
and not, whether it resends its history, sends only the new message, or both.

What is asserted is what reached the upstream: every earlier fact is in the last request,
and no message is sent (or stored) twice.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from proxy.testing.fake_upstream import Reply

MODEL = "gpt-4o"
FACT = "Remember the code CODE-X1."


def weather_calls(*cities: str) -> Reply:
    return Reply.tool_calls([
        {"id": f"call_{city.lower()}", "name": "get_weather", "arguments": {"city": city}}
        for city in cities
    ])


def contents(request: Any) -> list[str]:
    """The text of every message of a recorded upstream request."""
    out = []
    for message in request.body["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append(content or "")
    return out


def assert_memory_kept(proxy, fake, agent: str, session: str) -> None:
    """The last request carries the fact of the first turn and both tool results; the
    stored log holds every message once."""
    last = contents(fake.chat_requests[-1])
    assert FACT in last
    assert "sunny" in last and "rain" in last
    stored = proxy.stored(agent, session)
    fingerprints = [m.fingerprint for m in stored]
    assert len(fingerprints) == len(set(fingerprints)), [(m.role, m.content) for m in stored]
    users = [m.content for m in stored if m.role == "user"]
    assert users.count(FACT) == 1


# --- the OpenAI Agents SDK ------------------------------------------------------------


@pytest.fixture
def agents_sdk():
    import agents

    agents.set_tracing_disabled(True)  # it would export traces to the internet
    return agents


def sdk_agent(agents, proxy, session: str):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=proxy.url("sdk", session), api_key="sk-client-key-1",
                         max_retries=0)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return {"Paris": "sunny", "Lyon": "rain"}[city]

    model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    return agents.Agent(name="assistant", instructions="You are terse.", model=model,
                        tools=[get_weather]), client


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("with_session", [False, True], ids=["no-sdk-session", "sdk-session"])
async def test_the_openai_agents_sdk_keeps_its_memory(
    agents_sdk, proxy, fake, tmp_path, stream, with_session
):
    session_id = f"sdk-{stream}-{with_session}"
    agent, client = sdk_agent(agents_sdk, proxy, session_id)
    sdk_session = (
        agents_sdk.SQLiteSession(session_id, str(tmp_path / "sdk.db")) if with_session else None
    )
    fake.queue(Reply.text("Noted."), weather_calls("Paris", "Lyon"),
               Reply.text("Sunny in Paris, rain in Lyon."), Reply.text("CODE-X1."))

    async def run(text: str) -> str:
        if stream:
            result = agents_sdk.Runner.run_streamed(agent, text, session=sdk_session)
            async for _ in result.stream_events():
                pass
        else:
            result = await agents_sdk.Runner.run(agent, text, session=sdk_session)
        return str(result.final_output)

    try:
        assert await run(FACT) == "Noted."
        assert await run("What is the weather in Paris and Lyon?") == (
            "Sunny in Paris, rain in Lyon.")
        assert await run("Which code did I give you?") == "CODE-X1."
    finally:
        await client.close()
    assert_memory_kept(proxy, fake, "sdk", session_id)


# --- LangGraph and LangChain ---------------------------------------------------------


def langchain_model(proxy, session: str, *, streaming: bool):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=proxy.url("lc", session), api_key="sk-client-key-1",
                      max_retries=0, streaming=streaming, stream_usage=False)


def weather_tool():
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return {"Paris": "sunny", "Lyon": "rain"}[city]

    return get_weather


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("checkpointer", [False, True], ids=["no-checkpointer", "checkpointer"])
def test_a_langgraph_react_agent_keeps_its_memory(proxy, fake, stream, checkpointer):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.prebuilt import create_react_agent

    session = f"lg-{stream}-{checkpointer}"
    graph = create_react_agent(
        langchain_model(proxy, session, streaming=stream), [weather_tool()],
        prompt="You are terse.", checkpointer=InMemorySaver() if checkpointer else None,
    )
    config = {"configurable": {"thread_id": "t1"}}
    fake.queue(Reply.text("Noted."), weather_calls("Paris", "Lyon"),
               Reply.text("Sunny in Paris, rain in Lyon."), Reply.text("CODE-X1."))
    for text in (FACT, "What is the weather in Paris and Lyon?", "Which code did I give you?"):
        if stream:
            for _ in graph.stream({"messages": [("user", text)]}, config, stream_mode="values"):
                pass
        else:
            graph.invoke({"messages": [("user", text)]}, config)
    assert_memory_kept(proxy, fake, "lc", session)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_langchain_bind_tools_with_a_hand_written_loop_keeps_its_memory(proxy, fake, stream):
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

    session = f"bind-{stream}"
    tool = weather_tool()
    model = langchain_model(proxy, session, streaming=stream).bind_tools([tool])
    fake.queue(Reply.text("Noted."), weather_calls("Paris", "Lyon"),
               Reply.text("Sunny in Paris, rain in Lyon."), Reply.text("CODE-X1."))
    system = SystemMessage("You are terse.")

    def call(messages: list) -> Any:
        if not stream:
            return model.invoke(messages)
        merged = None
        for chunk in model.stream(messages):
            merged = chunk if merged is None else merged + chunk
        return merged

    call([system, HumanMessage(FACT)])
    # a loop that keeps only the current turn: the new question, then its tool round
    turn: list = [HumanMessage("What is the weather in Paris and Lyon?")]
    reply = call([system, *turn])
    assert len(reply.tool_calls) == 2
    turn.append(reply)
    turn += [ToolMessage(tool.invoke(c["args"]), tool_call_id=c["id"]) for c in reply.tool_calls]
    assert call([system, *turn]).content == "Sunny in Paris, rain in Lyon."
    assert call([system, HumanMessage("Which code did I give you?")]).content == "CODE-X1."
    assert_memory_kept(proxy, fake, "lc", session)


# --- openai-python ---------------------------------------------------------------------


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}}]


def answer_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    weather = {"Paris": "sunny", "Lyon": "rain"}
    return [{"role": "tool", "tool_call_id": c["id"],
             "content": weather[json.loads(c["function"]["arguments"])["city"]]} for c in calls]


def merged_stream(chunks) -> dict[str, Any]:
    text, calls = "", {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or ():
            entry = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            entry["function"]["name"] += call.function.name or ""
            entry["function"]["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def as_message(completion) -> dict[str, Any]:
    message = completion.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [c.model_dump(exclude_none=True) for c in message.tool_calls]
    return out


@pytest.mark.parametrize("style", ["full", "delta", "hybrid"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_python_sync_keeps_its_memory_in_every_form(proxy, fake, style, stream):
    session = f"py-{style}-{stream}"
    client = proxy.client("py", session)
    fake.queue(Reply.text("Noted."), weather_calls("Paris", "Lyon"),
               Reply.text("Sunny in Paris, rain in Lyon."), Reply.text("CODE-X1."))
    system = {"role": "system", "content": "You are terse."}
    history: list[dict[str, Any]] = []

    def ask(new: list[dict[str, Any]], turn_start: int) -> dict[str, Any]:
        sent = {"full": [*history, *new], "delta": new,
                "hybrid": [*history[turn_start:], *new] if new[0]["role"] == "tool" else new}
        kwargs = dict(model=MODEL, messages=[system, *sent[style]], tools=TOOLS)
        if stream:
            reply = merged_stream(client.chat.completions.create(stream=True, **kwargs))
        else:
            reply = as_message(client.chat.completions.create(**kwargs))
        history.extend([*new, reply])
        return reply

    ask([{"role": "user", "content": FACT}], 0)
    start = len(history)
    reply = ask([{"role": "user", "content": "What is the weather in Paris and Lyon?"}], start)
    ask(answer_calls(reply["tool_calls"]), start)
    assert ask([{"role": "user", "content": "Which code did I give you?"}], 0)["content"] == (
        "CODE-X1.")
    assert_memory_kept(proxy, fake, "py", session)


def test_openai_python_async_keeps_its_memory(proxy, fake):
    from openai import AsyncOpenAI

    async def session() -> None:
        client = AsyncOpenAI(base_url=proxy.url("py", "async"), api_key="sk-client-key-1",
                             max_retries=0)
        try:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": FACT}])
            turn = [{"role": "user", "content": "What is the weather in Paris and Lyon?"}]
            reply = as_message(await client.chat.completions.create(
                model=MODEL, messages=turn, tools=TOOLS))
            stream = await client.chat.completions.create(
                model=MODEL, messages=answer_calls(reply["tool_calls"]), tools=TOOLS,
                stream=True)
            async for _ in stream:
                pass
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Which code?"}])
        finally:
            await client.close()

    fake.queue(Reply.text("Noted."), weather_calls("Paris", "Lyon"),
               Reply.text("Sunny in Paris, rain in Lyon."), Reply.text("CODE-X1."))
    asyncio.run(session())
    assert_memory_kept(proxy, fake, "py", "async")
