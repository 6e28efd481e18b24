"""Agent loops that send only the new message between turns but resend the current turn
during its tool rounds keep their memory, whatever ``X-Memory-History`` says."""

from __future__ import annotations

import pytest

from proxy.testing.fake_upstream import Reply

SYSTEM = {"role": "system", "content": "You are terse."}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}}


def run_hybrid_session(client, fake, *, stream: bool, headers: dict[str, str]) -> None:
    """The reproduction: a fact, a tool turn resent whole during its round, a question."""

    def ask(messages: list[dict], **kwargs) -> dict:
        if not stream:
            message = client.chat.completions.create(
                model="gpt-4o", messages=messages, extra_headers=headers, **kwargs
            ).choices[0].message
            out = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
            return out
        text, calls = "", {}
        for chunk in client.chat.completions.create(
            model="gpt-4o", messages=messages, extra_headers=headers, stream=True, **kwargs
        ):
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is None:
                continue
            text += delta.content or ""
            for call in delta.tool_calls or ():
                entry = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
        out = {"role": "assistant", "content": text or None}
        if calls:
            out["tool_calls"] = [calls[i] for i in sorted(calls)]
        return out

    fake.queue(
        Reply.text("Noted."),
        Reply.tool_calls([
            {"id": "call_p", "name": "get_weather", "arguments": {"city": "Paris"}},
            {"id": "call_l", "name": "get_weather", "arguments": {"city": "Lyon"}},
        ]),
        Reply.text("Sunny in Paris, rain in Lyon."),
        Reply.text("CODE-X1."),
    )
    ask([SYSTEM, {"role": "user", "content": "Remember CODE-X1."}])
    turn = [{"role": "user", "content": "call get_weather for Paris and Lyon"}]
    turn.append(ask([SYSTEM, *turn], tools=[WEATHER]))
    turn += [
        {"role": "tool", "tool_call_id": "call_p", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_l", "content": "rain"},
    ]
    ask([SYSTEM, *turn], tools=[WEATHER])
    ask([SYSTEM, {"role": "user", "content": "Which codes?"}])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("history", [None, "delta"], ids=["auto", "delta-header"])
def test_a_hybrid_agent_loop_keeps_its_memory_and_stores_nothing_twice(
    proxy, fake, stream, history
):
    client = proxy.client("helper", f"hybrid-{stream}-{history}")
    headers = {"X-Memory-History": history} if history else {}
    run_hybrid_session(client, fake, stream=stream, headers=headers)

    expected = [
        ("user", "Remember CODE-X1."), ("assistant", "Noted."),
        ("user", "call get_weather for Paris and Lyon"), ("assistant", None),
        ("tool", "sunny"), ("tool", "rain"),
        ("assistant", "Sunny in Paris, rain in Lyon."),
        ("user", "Which codes?"), ("assistant", "CODE-X1."),
    ]
    stored = proxy.stored("helper", f"hybrid-{stream}-{history}")
    assert [(m.role, m.content or None) for m in stored] == expected
    last = fake.chat_requests[-1].body["messages"]
    assert [(m["role"], m.get("content") or None) for m in last] == [
        ("system", "You are terse."), *expected[:-1]
    ]
    # the tool round's request carried its user message once
    round_trip = fake.chat_requests[-2].body["messages"]
    assert [m.get("content") for m in round_trip].count(
        "call get_weather for Paris and Lyon"
    ) == 1


def test_a_hybrid_tool_round_declared_full_history_continues_the_turn(proxy, fake):
    client = proxy.client("helper", "hybrid-full")
    fake.queue(Reply.text("Noted."), Reply.tool_calls([
        {"id": "call_p", "name": "get_weather", "arguments": {"city": "Paris"}}]),
        Reply.text("Sunny."))
    client.chat.completions.create(model="gpt-4o", messages=[
        SYSTEM, {"role": "user", "content": "Remember CODE-X1."}])
    turn = [{"role": "user", "content": "weather?"}]
    message = client.chat.completions.create(
        model="gpt-4o", messages=[SYSTEM, *turn], tools=[WEATHER]).choices[0].message
    turn += [{"role": "assistant", "content": None,
              "tool_calls": [c.model_dump() for c in message.tool_calls]},
             {"role": "tool", "tool_call_id": "call_p", "content": "sunny"}]
    client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, *turn], tools=[WEATHER],
                                   extra_headers={"X-Memory-History": "full"})
    assert [m.content for m in proxy.stored("helper", "hybrid-full")][:2] == [
        "Remember CODE-X1.", "Noted."]
    assert "Remember CODE-X1." in [
        m.get("content") for m in fake.chat_requests[-1].body["messages"]]


def test_a_client_that_trims_its_own_history_keeps_the_memory_it_dropped(proxy, fake):
    client = proxy.client("helper", "trimming")
    history: list[dict] = []
    for n in range(6):
        history.append({"role": "user", "content": f"fact {n}"})
        fake.queue(Reply.text(f"noted {n}"))
        # the client keeps only its last three messages (and the new one)
        client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, *history[-4:]])
        history.append({"role": "assistant", "content": f"noted {n}"})
    stored = [m.content for m in proxy.stored("helper", "trimming")]
    assert stored == [m["content"] for m in history]
    sent = [m["content"] for m in fake.chat_requests[-1].body["messages"][1:]]
    assert sent == [m["content"] for m in history[:-1]]


def test_a_rewind_of_a_trimming_client_still_supersedes(proxy, fake):
    client = proxy.client("helper", "trim-rewind")
    history: list[dict] = []
    for n in range(4):
        history.append({"role": "user", "content": f"q{n}"})
        fake.queue(Reply.text(f"a{n}"))
        client.chat.completions.create(model="gpt-4o", messages=history[-3:])
        history.append({"role": "assistant", "content": f"a{n}"})
    # edit the last question: the client resends its last messages before it, then the edit
    fake.queue(Reply.text("a3 again"))
    client.chat.completions.create(model="gpt-4o", messages=[
        *history[-4:-2], {"role": "user", "content": "q3 edited"}])
    assert [m.content for m in proxy.stored("helper", "trim-rewind")] == [
        "q0", "a0", "q1", "a1", "q2", "a2", "q3 edited", "a3 again"]


def test_a_tool_round_resent_after_a_compaction_continues_the_compacted_turn(
    make_proxy, fake, agents_dir
):
    """The compaction after the tool-call reply folds the turn's user message: the page the
    next request loads starts after it, and the tool round is still found as the tail."""
    from e2e import write_agent

    from proxy.testing.fake_upstream import Reply as FakeReply
    from strategies.summary_prompt import SUMMARY_SYSTEM_PROMPT

    def model(body: dict) -> FakeReply:
        first = str((body.get("messages") or [{}])[0].get("content", ""))
        if first.startswith(SUMMARY_SYSTEM_PROMPT):
            return FakeReply.text("SUMMARY: the user asked for the weather of Paris.")
        last = body["messages"][-1]
        if last["role"] == "user" and "weather" in last["content"]:
            return FakeReply.tool_calls([{"id": "call_p", "name": "get_weather",
                                          "arguments": {"city": "Paris"}}])
        return FakeReply.text("Noted.")

    fake.default_reply = model
    write_agent(agents_dir, "compact", llm={"model": "gpt-4o", "contextWindow": 2000},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.5})
    proxy = make_proxy()
    client = proxy.client("compact", "hybrid")
    client.chat.completions.create(model="gpt-4o", messages=[
        SYSTEM, {"role": "user", "content": "Remember CODE-X1."}])
    ask = {"role": "user", "content": "weather in Paris? " + "alpha " * 900}
    message = client.chat.completions.create(
        model="gpt-4o", messages=[SYSTEM, ask], tools=[WEATHER]).choices[0].message
    proxy.drain()
    snapshot = proxy.snapshot("compact", "hybrid")
    # the compaction folded the turn's user message: the page after it starts later than
    # the tool round the client resends
    assert snapshot.meta.boundary_seq >= 3
    calls = [c.model_dump() for c in message.tool_calls]
    client.chat.completions.create(model="gpt-4o", tools=[WEATHER], messages=[
        SYSTEM, ask, {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_p", "content": "sunny"}])
    stored = proxy.stored("compact", "hybrid")
    assert [(m.role, m.content) for m in stored][:5] == [
        ("user", "Remember CODE-X1."), ("assistant", "Noted."), ("user", ask["content"]),
        ("assistant", None), ("tool", "sunny")]
    assert len(stored) == 6
    assert proxy.snapshot("compact", "hybrid").meta.active_count == 6  # nothing superseded
