"""Tool-result compression and eviction decisions, and the stubs they produce."""

from __future__ import annotations

import pytest
from helpers import FRAMING, assistant, history, tool, user

from strategies.compression import (
    STUB_HINT,
    choose_compressions,
    choose_evictions,
    compression_stub,
    compression_threshold,
    content_text,
    eviction_start,
    eviction_stub,
    exceeds,
    head_within,
    render_stored,
    stub_tokens,
)
from strategies.config import SummarizingWindowConfig, ToolResultEviction
from strategies.tokens import count_message, make_counter

CONFIG = SummarizingWindowConfig()  # threshold at a 10k window: max(500, 200) = 500
WINDOW = 10_000


def four_results(*sizes: int, read: bool = True):
    """A turn with four sequential tool calls a..d (results of ``sizes`` tokens of their
    own, oldest first), answered by the assistant when ``read``."""
    a, b, c, d = (size + FRAMING for size in sizes)
    messages = [
        user("q"),
        assistant(None, tool_calls=["a"]),
        tool("a", "A" * 40, tokens=a),
        assistant(None, tool_calls=["b"]),
        tool("b", tokens=b),
        assistant(None, tool_calls=["c"]),
        tool("c", tokens=c),
        assistant(None, tool_calls=["d"]),
        tool("d", tokens=d),
    ]
    if read:
        messages.append(assistant("done"))
    return history(*messages)


def decide(messages, config=CONFIG, window=WINDOW, **kwargs):
    kwargs.setdefault("under_pressure", True)
    return choose_compressions(messages, config, window, **kwargs)


# --- the four rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        pytest.param((600, 10, 10, 10), {3}, id="fourth-newest-is-compressed"),
        pytest.param((10, 600, 10, 10), set(), id="third-newest-is-protected"),
        pytest.param((10, 10, 600, 600), set(), id="second-and-newest-are-protected"),
        pytest.param((600, 600, 600, 600), {3}, id="only-the-fourth-of-four-big-ones"),
    ],
)
def test_the_newest_three_results_are_never_compressed(sizes, expected):
    assert set(decide(four_results(*sizes))) == expected


def test_the_newest_three_count_across_turns():
    messages = history(
        user("q1"),
        assistant(None, tool_calls=["a"]),
        tool("a", tokens=600),
        assistant("a1"),
        user("q2"),
        assistant(None, tool_calls=["b", "c"]),
        tool("b", tokens=600),
        tool("c", tokens=600),
        assistant("a2"),
        user("q3"),
        assistant(None, tool_calls=["d"]),
        tool("d", tokens=600),
        assistant("a3"),
    )
    assert set(decide(messages)) == {3}


def test_an_unread_result_is_never_compressed():
    # four parallel results, none answered yet: the oldest is not among the newest three
    unread = history(
        user("q"),
        assistant(None, tool_calls=["a", "b", "c", "d"]),
        tool("a", tokens=5000),
        tool("b"),
        tool("c"),
        tool("d"),
    )
    assert decide(unread) == {}
    read = history(*unread, assistant("done"))
    assert set(decide(read)) == {3}


@pytest.mark.parametrize(
    ("tokens", "compressed"),
    [
        pytest.param(499, False, id="just-under"),
        pytest.param(500, False, id="exactly-at"),
        pytest.param(501, True, id="just-above"),
    ],
)
def test_a_result_must_be_strictly_above_the_threshold(tokens, compressed):
    assert bool(decide(four_results(tokens, 10, 10, 10))) is compressed


@pytest.mark.parametrize(
    ("window", "tokens", "compressed"),
    [
        pytest.param(10_000, 501, True, id="small-window-floor-wins-above"),
        pytest.param(10_000, 500, False, id="small-window-floor-wins-at"),
        pytest.param(100_000, 2000, False, id="big-window-ratio-wins-at"),
        pytest.param(100_000, 2001, True, id="big-window-ratio-wins-above"),
        pytest.param(100_000, 1000, False, id="big-window-above-floor-below-ratio"),
    ],
)
def test_the_threshold_is_the_larger_of_floor_and_ratio(window, tokens, compressed):
    assert compression_threshold(CONFIG, window) == max(500, window * 0.02)
    assert bool(decide(four_results(tokens, 10, 10, 10), window=window)) is compressed


def test_no_pressure_means_no_compression():
    assert decide(four_results(5000, 10, 10, 10), under_pressure=False) == {}


def test_compress_tool_results_false_turns_everything_off():
    config = SummarizingWindowConfig(compressToolResults=False)
    assert decide(four_results(5000, 10, 10, 10), config=config) == {}


def test_an_already_compressed_result_is_not_decided_again():
    messages = four_results(5000, 10, 10, 10)
    messages[2].compressed_content = "old stub"
    assert decide(messages) == {}


def test_the_size_rule_uses_calibrated_tokens():
    messages = four_results(400, 10, 10, 10)
    assert decide(messages) == {}
    assert set(decide(messages, calibration=1.5)) == {3}


def test_eligible_restricts_candidates_without_moving_the_newest_three():
    messages = four_results(600, 10, 10, 10)
    assert decide(messages, eligible=frozenset({5, 7, 9})) == {}
    assert set(decide(messages, eligible=frozenset({3}))) == {3}


# --- stubs -------------------------------------------------------------------------------


def test_the_stub_carries_a_preview_the_size_and_the_hint_verbatim():
    stub = decide(four_results(600, 10, 10, 10))[3]
    assert stub.startswith("A" * 40)
    assert f"{600 + FRAMING} tokens compressed by memory-proxy" in stub  # the stored size
    assert "call the tool again if you need the full output" in stub
    assert STUB_HINT == "call the tool again if you need the full output"


def test_the_preview_is_bounded():
    stub = compression_stub("x" * 10_000, 2500)
    assert len(stub) < 450
    assert compression_stub("", 7).startswith("[7 tokens compressed")


def test_a_stored_stub_is_rendered_instead_of_the_original():
    message = tool("a", "original " * 500, tokens=1000)
    message.compressed_content = "short stub"
    item = render_stored(message, lambda text: len(text))
    # the chat format's 3 per message, the role ("tool": 4 by this counter) and the stub
    assert (item.text, item.marker, item.tokens) == ("short stub", "compressed", 3 + 4 + 10)
    assert message.content.startswith("original")
    plain = render_stored(tool("b", tokens=33), len)
    assert (plain.text, plain.marker, plain.tokens) == (None, None, 33)


@pytest.mark.parametrize("name", [None, "lookup"])
def test_a_stub_costs_what_the_tokenizer_counts_for_the_message_sent(name):
    message = tool("a", "x" * 4000, tokens=1004)
    message.name = name
    stub = compression_stub("x" * 4000, 1004)
    sent = {"role": "tool", "tool_call_id": "a", "content": stub, "name": name}
    assert stub_tokens(message, stub, make_counter("gpt-4o")) == count_message(sent, "gpt-4o")


# --- eviction ----------------------------------------------------------------------------


def three_turns():
    return history(
        user("q1"),  # 0
        assistant(None, tool_calls=["t1"]),  # 1
        tool("t1", tokens=500 + FRAMING),  # 2
        assistant("a1"),  # 3
        user("q2"),  # 4
        assistant(None, tool_calls=["t2"]),  # 5
        tool("t2", tokens=500 + FRAMING),  # 6
        assistant("a2"),  # 7
        user("q3"),  # 8
        assistant(None, tool_calls=["t3"]),  # 9
        tool("t3", tokens=500 + FRAMING),  # 10
        assistant("a3"),  # 11
    )


@pytest.mark.parametrize(
    ("after_turns", "start", "evicted"),
    [
        pytest.param(1, 8, {2, 6}, id="one-turn-everything-before-the-current-user-turn"),
        pytest.param(2, 4, {2}, id="two-turns-before-the-previous-user-turn"),
        pytest.param(3, 0, set(), id="three-turns-nothing-is-that-old"),
        pytest.param(4, 0, set(), id="more-turns-than-loaded"),
    ],
)
def test_eviction_starts_after_the_configured_number_of_user_turns(after_turns, start, evicted):
    messages = three_turns()
    assert eviction_start(messages, 8, after_turns) == start
    rule = ToolResultEviction(afterTurns=after_turns, aboveTokens=500)
    assert choose_evictions(messages, rule, 8) == evicted


@pytest.mark.parametrize(
    ("above", "evicted"),
    [
        pytest.param(499, {2, 6}, id="one-below-the-size"),
        pytest.param(500, {2, 6}, id="exactly-at-above-tokens-is-evicted"),
        pytest.param(501, set(), id="one-above-the-size-is-kept"),
    ],
)
def test_eviction_takes_results_of_at_least_above_tokens(above, evicted):
    rule = ToolResultEviction(afterTurns=1, aboveTokens=above)
    assert choose_evictions(three_turns(), rule, 8) == evicted


def test_eviction_has_no_newest_three_protection():
    # the only two older results are among the newest three and still go
    assert choose_evictions(three_turns(), ToolResultEviction(), 8) == {2, 6}


def test_eviction_ignores_the_read_rule():
    messages = history(
        user("q1"), assistant(None, tool_calls=["t1"]), tool("t1", tokens=900), user("q2")
    )
    assert choose_evictions(messages, ToolResultEviction(), 3) == {2}


def test_the_eviction_stub_names_the_call_and_the_fetch_tool():
    stub = eviction_stub("call_7", 1234)
    assert 'tool_call_id="call_7"' in stub
    assert "fetch_tool_result" in stub
    assert "1234 tokens" in stub


# --- helpers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "calibration", "expected"),
    [
        pytest.param(800, 1.0, False, id="exactly-at"),
        pytest.param(801, 1.0, True, id="one-above"),
        pytest.param(640, 1.25, False, id="calibrated-exactly-at"),
        pytest.param(641, 1.25, True, id="calibrated-above"),
    ],
)
def test_exceeds_is_strictly_above_the_ratio(tokens, calibration, expected):
    assert exceeds(tokens, 0.8, 1000, calibration) is expected


def test_exceeds_ignores_float_noise():
    assert not exceeds(6553.6, 0.8, 8192)


@pytest.mark.parametrize(
    ("content", "text"),
    [
        pytest.param(None, "", id="none"),
        pytest.param("plain", "plain", id="string"),
        pytest.param(
            [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}],
            "a\n[image_url]",
            id="parts-with-media",
        ),
    ],
)
def test_content_text_reads_strings_and_parts(content, text):
    assert content_text(content) == text


def test_head_within_returns_the_longest_prefix_that_fits():
    assert head_within("abcdefgh", 3, len) == "abc"
    assert head_within("abc", 5, len) == "abc"
    assert head_within("abc", 0, len) == ""


# --- sizes are the result's own, counted by the tokenizer -------------------------------


def result_of(tokens: int, call_id: str = "a") -> tuple[str, int]:
    """A tool result text of ``tokens`` gpt-4o tokens and its stored message's tokens."""
    text = " ".join(["hello"] * tokens)
    assert make_counter("gpt-4o")(text) == tokens
    sent = {"role": "tool", "tool_call_id": call_id, "content": text}
    return text, count_message(sent, "gpt-4o")


@pytest.mark.parametrize(("own", "compressed"), [(498, False), (500, False), (501, True)])
def test_min_tool_result_compress_tokens_compares_the_results_own_size(own, compressed):
    text, stored = result_of(own)
    assert stored == own + FRAMING  # the message around it weighs a little more
    messages = four_results(10, 10, 10, 10)
    messages[2] = tool("a", text, tokens=stored)
    messages[2].seq = 3
    stubs = decide(messages, count_tokens=make_counter("gpt-4o"))
    assert bool(stubs) is compressed


@pytest.mark.parametrize(("own", "evicted"), [(498, set()), (499, set()), (500, {2})])
def test_eviction_above_tokens_compares_the_results_own_size(own, evicted):
    text, stored = result_of(own, "t1")
    messages = history(user("q1"), assistant(None, tool_calls=["t1"]),
                       tool("t1", text, tokens=stored), assistant("a1"), user("q2"))
    rule = ToolResultEviction(afterTurns=1, aboveTokens=500)
    assert choose_evictions(messages, rule, 4, count_tokens=make_counter("gpt-4o")) == evicted
