"""summarizing_window end to end: a delta client (the openai SDK) -> the proxy -> the
recording fake upstream, with a 4,000-token context window so the rules trigger early.

At 4,000 tokens the default config means: compression above 2,000 live tokens for read
results of more than 500 tokens (max(500, 4000 x 0.02)), a window budget of 3,200 and a
single-message cap of 800. autoSummarize on the same agent: test_auto_summarize_end_to_end.py.
"""

from __future__ import annotations

import threading

import tiktoken
from e2e import write_agent
from summarizing_support import (
    MODEL,
    DeltaSession,
    agent_requests,
    memory_view,
    modified,
    prompt_tokens,
    read_results,
    scripted,
    sized,
    tool_contents,
)

from strategies.compression import STUB_HINT
from strategies.validity import check_openai_messages

WINDOW = 4000
THRESHOLD = 500
CAP = 800
BUDGET = 3200
SYSTEM = "You are a research helper."
TRUNCATED = "[… truncated by memory-proxy:"
# tokens of each tool result per turn (700 when not listed): turn 4 asks four tools at
# once, turn 5's result is small, turn 6's is larger than the single-message cap
RESULT_SIZES = {4: [600, 600, 600, 600], 5: [50], 6: [2000]}
TURNS = 14
# compression at every request under pressure, as the spec words it (the default's stable
# prefix compresses at trims only: tests/proxy/test_prompt_cache_end_to_end.py)
SPEC_POLICY = {"kind": "summarizing_window", "stablePrefix": False}


def results_for(turn: int) -> list[str]:
    return [sized(f"RESULT {turn}.{j}", n)
            for j, n in enumerate(RESULT_SIZES.get(turn, [700]))]


def test_a_long_tool_heavy_session_is_compressed_truncated_and_trimmed_by_the_rules(
    make_proxy, fake, agents_dir
):
    # the spec's per-request policy (stablePrefix off): every rule is checked on every
    # request (tests/proxy/test_prompt_cache_end_to_end.py covers the stable default)
    write_agent(agents_dir, "researcher", llm={"model": MODEL, "contextWindow": WINDOW},
                memoryConfig=SPEC_POLICY)
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("researcher", "long"), fake, system=SYSTEM)
    order: list[str] = []  # tool call ids in the order their results reached the proxy
    tokens: dict[str, int] = {}
    users: list[str] = []
    history = 0  # non-system messages of the client's conversation so far
    stubs_seen: dict[str, str] = {}
    trimmed_from: int | None = None
    for turn in range(1, TURNS + 1):
        results = results_for(turn)
        ask, answer = session.tool_turn(turn, results)
        new = [f"c{turn}_{j}" for j in range(len(results))]
        tokens.update({cid: RESULT_SIZES.get(turn, [700] * len(results))[j]
                       for j, cid in enumerate(new)})
        users.append(f"T{turn}x{len(results)}: look it up")
        checks = [(ask, list(order), history + 1, False),
                  (answer, [*order, *new], history + 2 + len(results), True)]
        order += new
        history += 3 + len(results)
        for sent, known, length, after_tools in checks:
            body = sent.messages
            assert check_openai_messages(body) == []
            assert body[0] == {"role": "system", "content": SYSTEM}
            conversation = body[1:]
            # the budget holds, with the upstream's own count
            assert prompt_tokens(body) <= BUDGET
            assert int(sent.headers["x-memory-window-tokens"]) <= BUDGET
            # trimming drops whole turns from the front: what is sent is a suffix
            sent_users = [m["content"] for m in conversation if m["role"] == "user"]
            assert sent_users == users[len(users) - len(sent_users):]
            contents = tool_contents(conversation)
            assert list(contents) == known[len(known) - len(contents):]
            if trimmed_from is None and len(sent_users) < len(users):
                trimmed_from = turn
            pressure = turn > 4 or (turn == 4 and after_tools)
            read, newest = read_results(conversation), set(known[-3:])
            changed = len(conversation) != length
            for cid, text in contents.items():
                original = session.results[cid]
                if pressure and cid in read and cid not in newest and tokens[cid] > THRESHOLD:
                    assert STUB_HINT in text and text.startswith(original[:40]), (turn, cid)
                    assert len(text) < 500
                    # decided once, persisted: the same stub every later turn
                    assert stubs_seen.setdefault(cid, text) == text
                elif tokens[cid] > CAP:
                    assert TRUNCATED in text and text.startswith(original[:200]), (turn, cid)
                else:
                    assert text == original, (turn, cid)
                changed = changed or text != original
            assert modified(sent.headers) is changed, (turn, after_tools)

    # what the session went through, in order
    assert set(stubs_seen) == {cid for cid in order if tokens[cid] > THRESHOLD} - set(order[-3:])
    assert "c6_0" in stubs_seen  # truncated while newest, compressed once read and older
    assert trimmed_from is not None and 8 <= trimmed_from < TURNS
    assert not modified(session.sent[0].headers)
    assert modified(session.sent[-1].headers)

    # lossless: every stored result is the original; the stub sits next to it
    stored = {m.tool_call_id: m for m in proxy.stored("researcher", "long") if m.role == "tool"}
    assert {cid: m.content for cid, m in stored.items()} == session.results
    assert {cid: m.compressed_content for cid, m in stored.items()
            if m.compressed_content is not None} == stubs_seen
    assert len(proxy.stored("researcher", "long")) == history

    # /memory shows the same window
    view = memory_view(proxy, "researcher", "long")
    totals = view["totals"]
    assert totals["trimmed"] > 0 and totals["context_modified"] is True
    assert totals["messages_stored"] == history
    assert totals["messages_sent"] + totals["trimmed"] == totals["messages_stored"]
    compressed = [m for m in view["messages"] if m.get("marker") == "compressed"]
    assert compressed and totals["compressed"] == len(compressed)
    for entry in compressed:
        message = stored[entry["tool_call_id"]]
        assert entry["text"] == message.compressed_content
        assert entry["stored_tokens"] == message.tokens > entry["tokens"]
    assert totals["live_ratio"] == round(totals["window_tokens"] * view["calibration"] / WINDOW, 4)
    assert 0.5 < totals["live_ratio"] <= 0.8


def test_without_pressure_no_result_is_compressed(make_proxy, fake, agents_dir):
    # 16,000 tokens: five turns of 700-token results stay under half of the window
    write_agent(agents_dir, "roomy", llm={"model": MODEL, "contextWindow": 16_000})
    scripted(fake)
    session = DeltaSession(make_proxy().client("roomy", "s"), fake)
    for turn in range(1, 6):
        session.tool_turn(turn, [sized(f"RESULT {turn}", 700)])
    last = session.sent[-1]
    assert tool_contents(last.messages) == session.results
    assert not modified(last.headers)


def test_compress_tool_results_false_sends_every_result_whole(make_proxy, fake, agents_dir):
    write_agent(agents_dir, "verbatim", llm={"model": MODEL, "contextWindow": WINDOW},
                memoryConfig={"kind": "summarizing_window", "compressToolResults": False})
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("verbatim", "s"), fake)
    for turn in range(1, 7):
        session.tool_turn(turn, [sized(f"RESULT {turn}", 700)])
    for sent in session.sent:
        assert all(STUB_HINT not in text for text in tool_contents(sent.messages).values())
        assert check_openai_messages(sent.messages) == []
        assert prompt_tokens(sent.messages) <= BUDGET
    # the budget is kept by trimming alone
    assert modified(session.sent[-1].headers)
    assert len(tool_contents(session.sent[-1].messages)) < 6
    assert all(m.compressed_content is None for m in proxy.stored("verbatim", "s"))


# --- token counts are cached per stored message ---------------------------------------------


def test_stored_messages_are_never_tokenized_again_on_later_turns(
    make_proxy, fake, agents_dir, monkeypatch
):
    """Counts are made once, at persist time; what a strategy renders every turn (stubs,
    truncations, the summary) is remembered. The tokenizer's work per turn follows what
    the turn brings, not the length of the history."""
    write_agent(agents_dir, "counted", llm={"model": MODEL, "contextWindow": WINDOW},
                memoryConfig=SPEC_POLICY)
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("counted", "s"), fake, system=SYSTEM)
    turns = 24
    results = {k: sized(f"RESULT {k}", 2000 if k % 5 == 0 else 700) for k in range(1, turns + 1)}
    seen: list[str] = []
    encode = tiktoken.Encoding.encode_ordinary

    def counting(self, text):
        # the proxy serves on its own thread; the fake's usage counts run on another
        if threading.current_thread() is proxy.server.thread:
            seen.append(text)
        return encode(self, text)

    monkeypatch.setattr(tiktoken.Encoding, "encode_ordinary", counting)
    calls, chars = {}, {}
    stubs: set[str] = set()  # the stubs sent on earlier turns
    for turn in range(1, turns + 1):
        start = len(seen)
        session.tool_turn(turn, [results[turn]])
        tokenized = seen[start:]
        calls[turn], chars[turn] = len(tokenized), sum(map(len, tokenized))
        older = [results[k] for k in range(1, turn)]
        assert not [t for t in tokenized if len(t) > 40 and any(r.startswith(t) for r in older)]
        assert not stubs & set(tokenized)
        stubs |= {t for sent in session.sent for t in tool_contents(sent.messages).values()
                  if STUB_HINT in t}
    last = session.sent[-1]
    # the session went through compression, truncation and trimming meanwhile
    assert modified(last.headers)
    assert any(STUB_HINT in t for t in tool_contents(last.messages).values())
    assert len([m for m in last.messages if m["role"] == "user"]) < turns
    same_shape = [t for t in range(6, turns + 1) if t % 5]
    assert max(calls[t] for t in same_shape[-5:]) <= min(calls[t] for t in same_shape[:5])
    # what is tokenized is the turn's new result, its user message, reply and one stub
    assert all(chars[t] <= len(results[t]) + 1000 for t in same_shape), chars


def test_a_full_history_clients_first_request_is_compressed_and_stored_losslessly(
    make_proxy, fake, agents_dir
):
    """Stubs decided for the request's own new messages are written with them."""
    write_agent(agents_dir, "resent", llm={"model": MODEL, "contextWindow": WINDOW},
                memoryConfig=SPEC_POLICY)
    scripted(fake)
    proxy = make_proxy()
    history: list[dict] = []
    results = {}
    for turn in range(1, 5):
        cid = f"old{turn}"
        results[cid] = sized(f"RESULT {turn}", 700)
        history += [
            {"role": "user", "content": f"question {turn}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function",
                 "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": cid, "content": results[cid]},
            {"role": "assistant", "content": f"answer {turn}"},
        ]
    history.append({"role": "user", "content": "and now?"})
    raw = proxy.client("resent", "s").chat.completions.with_raw_response.create(
        model=MODEL, messages=history)
    assert modified(dict(raw.headers))
    sent = tool_contents(agent_requests(fake)[-1].body["messages"])
    assert STUB_HINT in sent["old1"]
    assert [sent[f"old{n}"] for n in (2, 3, 4)] == [results[f"old{n}"] for n in (2, 3, 4)]
    stored = {m.tool_call_id: m for m in proxy.stored("resent", "s") if m.role == "tool"}
    assert {cid: m.content for cid, m in stored.items()} == results
    assert stored["old1"].compressed_content == sent["old1"]
    assert [stored[f"old{n}"].compressed_content for n in (2, 3, 4)] == [None] * 3
