"""full, windowed and none as the upstream sees them, configured by agent definition files."""

from __future__ import annotations

import httpx
from e2e import ADMIN_TOKEN, CLIENT_KEY, write_agent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.testing.fake_upstream import Reply
from strategies.validity import check_openai_messages


def converse(client, turns: int, prefix: str = "q") -> None:
    for n in range(turns):
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"{prefix}{n}"}]
        )


def user_texts(fake) -> list[str]:
    return [m["content"] for m in fake.chat_requests[-1].body["messages"] if m["role"] == "user"]


def test_windowed_sends_the_last_n_stored_messages(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "win", memoryConfig={"kind": "windowed", "windowSize": 4})
    proxy = make_proxy()
    converse(proxy.client("win", "s"), 5)
    # the last 4 of q0 a0 q1 a1 q2 a2 q3 a3 q4 are a2 q3 a3 q4; a window starts with a user
    assert user_texts(fake) == ["q3", "q4"]
    assert [m["role"] for m in fake.chat_requests[-1].body["messages"]] == [
        "user",
        "assistant",
        "user",
    ]
    response = httpx.post(
        f"{proxy.url('win', 's')}/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "q5"}]},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
    )
    assert response.headers["x-memory-strategy"] == "windowed"
    assert response.headers["x-memory-context-modified"] == "true"


def test_full_sends_everything_up_to_max_history_fetch(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "all", memoryConfig={"kind": "full"})
    write_agent(agents_dir, "capped", memoryConfig={"kind": "full", "maxHistoryFetch": 3})
    proxy = make_proxy()
    converse(proxy.client("all", "s"), 4)
    assert user_texts(fake) == ["q0", "q1", "q2", "q3"]
    converse(proxy.client("capped", "s"), 4)
    # three loaded (a1 q2 a2) -> the window starts at the first user message among them
    assert user_texts(fake) == ["q2", "q3"]


def test_none_sends_only_the_system_prompt_and_the_current_turn(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "stateless", memoryConfig={"kind": "none"})
    proxy = make_proxy()
    client = proxy.client("stateless", "s")
    client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "first"}],
    )
    fake.queue(Reply.tool_calls([{"id": "c1", "name": "look", "arguments": {}}]))
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "second"}])
    client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "tool", "tool_call_id": "c1", "content": "result"}]
    )
    sent = fake.chat_requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[1]["content"] == "second"
    # everything is still stored
    assert len(proxy.stored("stateless", "s")) == 6


def test_an_agent_in_delta_mode_appends_assistant_messages_it_is_sent(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "deltas", historyMode="delta")
    proxy = make_proxy()
    client = proxy.client("deltas", "s")
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "a"}])
    client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "assistant", "content": "primer"}, {"role": "user", "content": "b"}],
    )
    assert [m.content for m in proxy.stored("deltas", "s")][2:4] == ["primer", "b"]


def test_an_unknown_agent_runs_with_the_default_config(proxy, fake):
    proxy.client("never-defined", "s").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    view = httpx.get(
        f"{proxy.base}/memory/never-defined/s", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ).json()
    assert view["strategy"] == "summarizing_window"
    assert view["configured"] is False


def test_a_custom_mapper_is_loaded_from_a_dotted_path_and_sees_every_message(make_proxy, fake):
    proxy = make_proxy(mapper="tests_support_mapper:ShoutingMapper")
    proxy.client("m", "s").chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "quiet please"},
        ],
    )
    sent = fake.chat_requests[-1].body["messages"]
    assert sent[-1]["content"] == "QUIET PLEASE"


def test_context_windows_come_from_the_definition_first(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "small", llm={"model": "gpt-4o", "contextWindow": 4096})
    proxy = make_proxy()
    proxy.client("small", "s").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    proxy.client("big", "s").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert httpx.get(f"{proxy.base}/memory/small/s", headers=auth).json()["context_window"] == 4096
    # no definition: litellm's model map says what gpt-4o takes
    assert httpx.get(f"{proxy.base}/memory/big/s", headers=auth).json()["context_window"] == 128000


KINDS = [
    {"kind": "windowed", "windowSize": 3},
    {"kind": "full", "maxHistoryFetch": 5},
    {"kind": "none"},
    {"kind": "summarizing_window"},
]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(st.sampled_from(["user", "tools", "tools2"]), min_size=1, max_size=8),
    kind=st.integers(0, len(KINDS) - 1),
)
def test_what_reaches_the_upstream_is_always_valid(make_proxy, fake, agents_dir, steps, kind):
    """Random tool-heavy sessions through the real proxy: every request the upstream gets
    passes the strict-provider checks."""
    name = f"prop{kind}"
    if not (agents_dir / f"{name}.json").exists():
        for i, config in enumerate(KINDS):
            write_agent(agents_dir, f"prop{i}", memoryConfig=config)
    proxy = getattr(test_what_reaches_the_upstream_is_always_valid, "_proxy", None)
    if proxy is None or proxy.services.settings.agents_dir != agents_dir:
        proxy = make_proxy()
        test_what_reaches_the_upstream_is_always_valid._proxy = proxy  # type: ignore[attr-defined]
    session = f"s{len(fake.chat_requests)}"
    client = proxy.client(name, session)
    for index, step in enumerate(steps):
        if step == "user":
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": f"u{index}"}]
            )
            continue
        calls = [
            {"id": f"c{index}_{j}", "name": "t", "arguments": {"j": j}}
            for j in range(1 if step == "tools" else 2)
        ]
        fake.queue(Reply.tool_calls(calls))
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"u{index}"}]
        )
        client.chat.completions.create(
            model="gpt-4o",
            messages=[
                {"role": "tool", "tool_call_id": c["id"], "content": "r" * 50} for c in calls
            ],
        )
    for request in fake.chat_requests:
        assert check_openai_messages(request.body["messages"]) == []
