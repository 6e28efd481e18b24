"""The OpenAI Agents SDK's default model (the Responses API) through the proxy: several
``Runner.run``s on one session, chained by ``previous_response_id`` (a delta client) and
by resending the whole input (a full-history client), with parallel tool calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.testing.fake_upstream import FakeUpstream, Reply

MODEL = "gpt-4o"
FACT = "Remember the code CODE-X1."


@pytest.fixture
def agents_sdk(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    import agents

    agents.set_tracing_disabled(True)  # it would export traces to the internet
    return agents


def weather_calls(*cities: str) -> Reply:
    return Reply.tool_calls([
        {"id": f"call_{city.lower()}", "name": "get_weather", "arguments": {"city": city}}
        for city in cities
    ])


def last_request_text(fake: FakeUpstream) -> str:
    body = [r for r in fake.requests if r.method == "POST"][-1].body
    return json.dumps(body.get("input") if "input" in body else body.get("messages"))


def make_agent(agents: Any, proxy: Any, session: str) -> tuple[Any, Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=proxy.url("sdk", session), api_key="sk-client-key-1",
                         max_retries=0)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return {"Paris": "sunny", "Lyon": "rain"}[city]

    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
    agent = agents.Agent(name="assistant", instructions="You are terse.", model=model,
                         tools=[get_weather])
    return agent, client


@pytest.mark.parametrize("chained", [True, False], ids=["previous_response_id", "whole-input"])
async def test_runs_on_one_session_keep_their_memory(agents_sdk, proxy, fake, chained):
    session = f"sdk-{chained}"
    agent, client = make_agent(agents_sdk, proxy, session)
    fake.queue(Reply.text("Noted."), weather_calls("Paris", "Lyon"),
               Reply.text("Sunny in Paris, rain in Lyon."), Reply.text("CODE-X1."))
    previous: Any = None
    try:
        for text, expected in [
            (FACT, "Noted."),
            ("What is the weather in Paris and Lyon?", "Sunny in Paris, rain in Lyon."),
            ("Which code did I give you?", "CODE-X1."),
        ]:
            if chained:
                result = await agents_sdk.Runner.run(
                    agent, text,
                    previous_response_id=previous.last_response_id if previous else None,
                )
            else:
                sent = [*previous.to_input_list(), {"role": "user", "content": text}] if (
                    previous) else text
                result = await agents_sdk.Runner.run(agent, sent)
            assert result.final_output == expected
            previous = result
    finally:
        await client.close()
    last = last_request_text(fake)
    assert FACT in last and "sunny" in last and "rain" in last
    stored = proxy.stored("sdk", session)
    users = [m.content for m in stored if m.role == "user"]
    assert users.count(FACT) == 1, users
    tools = [m.tool_call_id for m in stored if m.role == "tool"]
    assert sorted(tools) == ["call_lyon", "call_paris"]
    assert len(stored) == 9  # 3 questions, 4 replies (one with both calls), 2 results
