"""Tool result caps: ``maxResultChars`` per tool and a 100k cap for every tool, applied at
persist time with a visible note; a client resending the uncut result still matches."""

from __future__ import annotations

import pytest
from e2e import write_agent

from proxy.agents import ResolvedAgent, parse_definition
from proxy.testing.fake_upstream import Reply
from proxy.turn.tool_caps import TOOL_RESULT_CAP, cap_tool_result, result_limit, truncation_note


def call(call_id: str, name: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def sent_tool_result(fake) -> str:
    (tool,) = [m for m in fake.chat_requests[-1].body["messages"] if m["role"] == "tool"]
    return tool["content"]


def test_a_tools_max_result_chars_cuts_its_result_before_it_is_stored(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "searcher", tools=[{"name": "web_search", "maxResultChars": 1000}])
    proxy = make_proxy()
    client = proxy.client("searcher", "s")
    fake.queue(Reply.tool_calls([{"id": "call_1", "name": "web_search", "arguments": {}}]))
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "go"}])

    result = "".join(f"{n:05d}" for n in range(1000))  # 5,000 characters
    client.chat.completions.create(model="gpt-4o", messages=[
        {"role": "tool", "tool_call_id": "call_1", "content": result}])

    expected = result[:1000] + "\n" + truncation_note("web_search", 1000, 5000)
    (stored,) = [m for m in proxy.stored("searcher", "s") if m.role == "tool"]
    assert stored.content == expected
    assert expected.endswith("cut to 1,000 of 5,000 characters; the rest was not kept]")
    assert sent_tool_result(fake) == expected


def test_every_tool_result_is_capped_at_100k_characters(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "reader", tools=[{"name": "read_file"}])
    proxy = make_proxy()
    client = proxy.client("reader", "s")
    big = "y" * 150_000
    fake.queue(Reply.text("done"))
    client.chat.completions.create(model="gpt-4o", messages=[
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "unlisted_tool")]},
        {"role": "tool", "tool_call_id": "c1", "content": big},
    ])

    (stored,) = [m for m in proxy.stored("reader", "s") if m.role == "tool"]
    assert stored.content == "y" * TOOL_RESULT_CAP + "\n" + truncation_note(
        "unlisted_tool", 100_000, 150_000)


def test_a_full_history_client_resending_the_uncut_result_still_matches(
    make_proxy, fake, agents_dir
):
    write_agent(agents_dir, "searcher", tools=[{"name": "web_search", "maxResultChars": 50}])
    proxy = make_proxy()
    client = proxy.client("searcher", "full")
    uncut = "z" * 500
    history = [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": None, "tool_calls": [call("c9", "web_search")]},
        {"role": "tool", "tool_call_id": "c9", "content": uncut},
    ]
    fake.queue(Reply.text("found"), Reply.text("you're welcome"), Reply.text("bye"))
    for follow_up in ("thanks", "bye"):
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history += [{"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": follow_up}]
    client.chat.completions.create(model="gpt-4o", messages=history)

    stored = proxy.stored("searcher", "full")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "user",
                                        "assistant", "user", "assistant"]
    # nothing was rewound or stored twice: the seqs run without gaps
    assert [m.seq for m in stored] == list(range(1, len(stored) + 1))
    assert proxy.snapshot("searcher", "full").meta.active_count == len(stored)
    assert stored[2].content.startswith("z" * 50 + "\n[truncated: the web_search result")
    assert sent_tool_result(fake) == stored[2].content


def test_a_tool_result_within_its_limit_is_kept_whole(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "searcher", tools=[{"name": "web_search", "maxResultChars": 100}])
    proxy = make_proxy()
    proxy.client("searcher", "ok").chat.completions.create(model="gpt-4o", messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "web_search")]},
        {"role": "tool", "tool_call_id": "c1", "content": "a" * 100},
    ])
    (stored,) = [m for m in proxy.stored("searcher", "ok") if m.role == "tool"]
    assert stored.content == "a" * 100


def test_text_parts_are_cut_across_parts_and_other_parts_kept():
    message = {"role": "tool", "tool_call_id": "c", "content": [
        {"type": "text", "text": "abcdef"}, {"type": "image_url", "image_url": {"url": "u"}},
        {"type": "text", "text": "ghijkl"}, {"type": "text", "text": "mnop"}]}

    cut = cap_tool_result(message, 8, "shot")

    assert cut["content"] == [
        {"type": "text", "text": "abcdef"}, {"type": "image_url", "image_url": {"url": "u"}},
        {"type": "text", "text": "gh"}, {"type": "text", "text": truncation_note("shot", 8, 16)}]
    assert message["content"][2]["text"] == "ghijkl"  # the client's message is not touched


@pytest.mark.parametrize(
    ("tools", "tool", "limit"),
    [
        pytest.param([{"name": "t", "maxResultChars": 20_000}], "t", 20_000, id="own-limit"),
        pytest.param([{"name": "t", "maxResultChars": 500_000}], "t", 100_000,
                     id="never-above-cap"),
        pytest.param([{"name": "t"}], "t", 100_000, id="listed-without-limit"),
        pytest.param([], None, 100_000, id="unknown-call"),
    ],
)
def test_the_limit_is_the_tools_own_never_above_the_cap(tools, tool, limit):
    definition, config = parse_definition({"name": "a", "tools": tools})
    agent = ResolvedAgent("a", definition, config, "file", False)
    assert result_limit(agent, tool) == limit
