"""summarizing_window's stable prefix (the default): the window start stays fixed until the
budget is reached, then the window is trimmed in one step to trimTargetShare of the budget
and compression stubs are applied in that one step. The start comes from the log (the
``window`` meta the proxy stores on each reply), never from the strategy's memory.

The sessions grow turn by turn as the proxy grows them: every select's stubs are persisted
(``compressed_content``) and its window start is written on the reply's record."""

from __future__ import annotations

import dataclasses
import itertools

from helpers import assistant, context, history, seqs, tool, turn_start, user
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from soak import examples

from strategies.base import Window
from strategies.compression import (
    NEWEST_PROTECTED,
    STUB_HINT,
    compression_threshold,
    render_stored,
)
from strategies.config import SummarizingWindowConfig
from strategies.records import StoredMessage
from strategies.summarizing_window import (
    CACHE_EVIDENCE_REPLIES,
    CACHE_META,
    WINDOW_META,
    SummarizingWindowStrategy,
    upstream_caches,
    window_anchor,
)
from strategies.validity import check_openai_messages

STRATEGY = SummarizingWindowStrategy()
SYSTEM = 50


def reply(window: Window, text: str = "done", calls: list[str] | None = None, tokens: int = 10):
    """The assistant reply the proxy stores for ``window``: its start on the record."""
    message = assistant(text if not calls else None, tool_calls=calls, tokens=tokens)
    message.meta = {WINDOW_META: {"start": window.items[0].message.seq}}
    return message


def persist(messages: list[StoredMessage], window: Window) -> None:
    """The stubs the window decided, written to the records (as the proxy's append does)."""
    for message in messages:
        if message.seq in window.new_stubs:
            message.compressed_content = window.new_stubs[message.seq]


def rendered(window: Window) -> list[tuple[int, str | None]]:
    return [(i.message.seq, i.text) for i in window.items]


def over_budget_from(
    messages: list[StoredMessage], start_seq: int, cfg, context_window: int
) -> bool:
    """Whether the messages from ``start_seq`` on, as stored (stubs included), exceed the
    budget: the moment a stable window may change."""
    count = context([]).count_tokens
    total = SYSTEM + sum(render_stored(m, count).tokens for m in messages if m.seq >= start_seq)
    return total > cfg.maxConversationRatio * context_window


@st.composite
def sessions(draw):
    """Turns of a coding agent: a question, 1-3 tool calls in rounds, an answer."""
    return [
        (draw(st.integers(5, 60)), draw(st.lists(st.integers(20, 900), min_size=1, max_size=3)))
        for _ in range(draw(st.integers(3, 18)))
    ]


def grow(turns, cfg, context_window):
    """Run the session request by request; yields (messages, window) per request."""
    ids = itertools.count(1)
    messages: list[StoredMessage] = []
    for number, (question, results) in enumerate(turns):
        messages = history(*messages, user(f"q{number}", tokens=question))
        for size in [*results, None]:
            ctx = context(messages, cfg, context_window=context_window, system_tokens=SYSTEM)
            window = STRATEGY.select(ctx)
            yield messages, window
            persist(messages, window)
            if size is None:
                messages = history(*messages, reply(window))
            else:
                cid = f"c{next(ids)}"
                messages = history(*messages, reply(window, calls=[cid]),
                                   tool(cid, "R" * 40, tokens=size))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=sessions(),
    context_window=st.sampled_from([2000, 4000, 8000]),
    budget=st.sampled_from([0.5, 0.8]),
    share=st.sampled_from([0.3, 0.55, 1.0]),
    pressure=st.sampled_from([0.1, 0.5]),
)
def test_the_start_never_moves_back_the_budget_holds_and_stubs_come_in_batches(
    turns, context_window, budget, share, pressure
):
    cfg = SummarizingWindowConfig(stablePrefix=True, maxConversationRatio=budget,
                                  trimTargetShare=share,
                                  compressWhenWindowAboveRatio=pressure,
                                  minToolResultCompressTokens=100)
    previous: Window | None = None
    for messages, window in grow(turns, cfg, context_window):
        sent = seqs(window)
        turn = turn_start(messages)
        current = [m.seq for m in messages[turn:]]
        assert sent[-len(current):] == current, "the current turn is sent whole"
        assert check_openai_messages(
            [{"role": "system", "content": "s"}]
            + [{"role": i.message.role, "content": i.text or i.message.content,
                **({"tool_calls": i.message.tool_calls} if i.message.tool_calls else {}),
                **({"tool_call_id": i.message.tool_call_id} if i.message.role == "tool"
                   else {})} for i in window.items]) == []
        if window.tokens > round(budget * context_window, 6):
            assert sent == current, "only the current turn alone may exceed the budget"
        anchor = window_anchor(messages)
        if previous is not None and anchor is not None:
            assert sent[0] >= min(anchor, current[0]), "the start never moves back"
            changed = window.new_stubs or sent[0] != anchor
            if changed:
                # a change happens only when the window from the held start overflowed
                assert over_budget_from(messages, anchor, cfg, context_window)
            else:
                # unchanged: the previous window is a prefix of this one, byte for byte
                assert rendered(window)[: len(previous.items)] == rendered(previous)
        # every stub obeys the spec's four rules
        results = [i for i, m in enumerate(messages) if m.role == "tool"]
        newest = {messages[i].seq for i in results[-NEWEST_PROTECTED:]}
        last_assistant = max(i for i, m in enumerate(messages) if m.role == "assistant"
                             ) if any(m.role == "assistant" for m in messages) else -1
        for seq, stub in window.new_stubs.items():
            index = next(i for i, m in enumerate(messages) if m.seq == seq)
            assert messages[index].role == "tool" and index < last_assistant
            assert seq not in newest
            assert messages[index].tokens > compression_threshold(cfg, context_window)
            assert STUB_HINT in stub
        previous = window


def _overflowing_session():
    """Eleven 300-token turns (3,370 tokens with the system prompt and the question)."""
    messages = []
    for n in range(11):
        messages += [user(f"q{n}", tokens=150), assistant(f"a{n}", tokens=150)]
    return history(*messages, user("now", tokens=20))


def test_an_overflow_trims_down_to_the_target_share_in_one_step():
    cfg = SummarizingWindowConfig(stablePrefix=True, trimTargetShare=0.5)
    messages = _overflowing_session()
    window = STRATEGY.select(context(messages, cfg, context_window=4000, system_tokens=SYSTEM))
    # 3,200 budget, target 1,600: 50 + 20 + five 300-token turns = 1,570
    assert window.tokens == 1570
    assert seqs(window)[0] == 13


def test_the_held_start_stays_while_the_window_fits_the_budget():
    cfg = SummarizingWindowConfig(stablePrefix=True, trimTargetShare=0.5)
    messages = _overflowing_session()
    messages[-2].meta = {WINDOW_META: {"start": 5}}  # the previous reply's window start
    window = STRATEGY.select(context(messages, cfg, context_window=8000, system_tokens=SYSTEM))
    assert seqs(window)[0] == 5, "the spec would send everything (it fits): the start holds"


def test_without_a_stable_prefix_the_window_is_refitted_from_scratch():
    cfg = SummarizingWindowConfig(stablePrefix=False)
    messages = _overflowing_session()
    messages[-2].meta = {WINDOW_META: {"start": 5}}
    window = STRATEGY.select(context(messages, cfg, context_window=8000, system_tokens=SYSTEM))
    assert seqs(window)[0] == 1


def test_a_stored_start_inside_the_current_turn_still_sends_the_turn_whole():
    cfg = SummarizingWindowConfig(stablePrefix=True)
    messages = history(user("q", tokens=10), assistant(None, tool_calls=["a"], tokens=10),
                       tool("a", tokens=10))
    messages[1].meta = {WINDOW_META: {"start": 3}}
    window = STRATEGY.select(context(messages, cfg, context_window=8000))
    assert seqs(window) == [1, 2, 3]


def test_a_client_message_without_window_meta_starts_the_window_anew():
    messages = _overflowing_session()
    messages[-2] = dataclasses.replace(messages[-2], meta={})
    assert window_anchor(messages) is None


def _cache_reading(message, cached: int):
    return dataclasses.replace(message, meta={**message.meta, CACHE_META: {
        "prompt": 900, "cached": cached, "written": 0}})


def test_auto_holds_the_start_once_the_upstream_reports_caching():
    cfg = SummarizingWindowConfig(trimTargetShare=0.5)  # stablePrefix "auto", the default
    messages = _overflowing_session()
    messages[-2] = _cache_reading(messages[-2], 0)
    messages[-2].meta[WINDOW_META] = {"start": 5}
    ctx = context(messages, cfg, context_window=8000, system_tokens=SYSTEM)
    assert seqs(STRATEGY.select(ctx))[0] == 1, "no cache read yet: the spec's refit"
    messages[-4] = _cache_reading(messages[-4], 700)
    ctx = context(messages, cfg, context_window=8000, system_tokens=SYSTEM)
    assert seqs(STRATEGY.select(ctx))[0] == 5, "the upstream caches: the start holds"


def test_auto_forgets_a_cache_reading_older_than_its_evidence_span():
    messages = [user("q0", tokens=10), _cache_reading(assistant("a0", tokens=10), 500)]
    for n in range(1, CACHE_EVIDENCE_REPLIES + 1):
        messages += [user(f"q{n}", tokens=10), assistant(f"a{n}", tokens=10)]
    messages = history(*messages)
    assert not upstream_caches(messages)
    assert upstream_caches(messages[:-2])
