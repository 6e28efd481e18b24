"""Token budgets that hold: the local estimate is calibrated against the upstream's
reported usage.prompt_tokens, persisted with the turn and used by the strategy."""

from __future__ import annotations

import pytest
from e2e import write_agent
from summarizing_support import MODEL, DeltaSession, prompt_tokens, scripted, sized

from proxy.turn.persist import (
    CALIBRATION_BOUNDS,
    CALIBRATION_TRUSTED_TOKENS,
    CALIBRATION_WEIGHT,
    calibrated,
)
from strategies.tokens import CL100K, O200K, encoding_for_model

WINDOW = 4000
BUDGET = 0.8 * WINDOW


@pytest.mark.parametrize(
    ("previous", "estimate", "reported", "expected"),
    [
        pytest.param(1.0, 1000, None, None, id="no-usage-keeps-the-factor"),
        pytest.param(1.0, 0, 500, None, id="nothing-estimated"),
        pytest.param(1.0, 1000, 1500, 1.5, id="an-underestimate-is-corrected-at-once"),
        pytest.param(1.0, 20, 24, round(0.7 + 0.3 * 1.2, 4),
                     id="a-small-prompt-is-blended-in"),
        pytest.param(1.0, 500, 600, 1.2, id="exactly-at-the-trusted-size"),
        pytest.param(1.0, 499, 600, round(0.7 + 0.3 * 600 / 499, 4), id="just-under-it"),
        pytest.param(1.2, 1000, 1000, round(0.7 * 1.2 + 0.3 * 1.0, 4),
                     id="an-overestimate-is-blended-down"),
        pytest.param(1.0, 1000, 10_000, CALIBRATION_BOUNDS[1], id="clamped-high"),
        pytest.param(1.0, 1000, 100, round(0.7 + 0.3 * CALIBRATION_BOUNDS[0], 4),
                     id="clamped-low"),
    ],
)
def test_the_calibration_factor_follows_the_reported_prompt_size(
    previous, estimate, reported, expected
):
    assert (CALIBRATION_WEIGHT, CALIBRATION_TRUSTED_TOKENS) == (0.3, 500)
    assert calibrated(previous, estimate, reported) == expected


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        pytest.param("gpt-4o", O200K, id="gpt-4o"),
        pytest.param("openai/gpt-4.1-mini", O200K, id="provider-prefixed"),
        pytest.param("o3-mini", O200K, id="o-series"),
        pytest.param("gpt-4-turbo", CL100K, id="gpt-4"),
        pytest.param("gpt-3.5-turbo", CL100K, id="gpt-3.5"),
        pytest.param("anthropic/claude-3-5-sonnet", CL100K, id="other-families-estimated"),
    ],
)
def test_the_tokenizer_matches_the_model_family(model, encoding):
    assert encoding_for_model(model) == encoding


def dense_session(make_proxy, fake, agents_dir, factor: float):
    """A proxy whose upstream counts ``factor`` times what tiktoken counts; no single
    message cap, so a long message reaches the upstream whole; the window refitted at
    every request (the spec's policy), so each request shows the budget it was fitted to."""
    write_agent(agents_dir, "dense", llm={"model": MODEL, "contextWindow": WINDOW},
                memoryConfig={"kind": "summarizing_window", "maxMessageRatio": 1.0,
                              "stablePrefix": False})
    scripted(fake)
    fake.count_tokens = lambda body: round(factor * prompt_tokens(body["messages"]))
    proxy = make_proxy()
    return proxy, DeltaSession(proxy.client("dense", "s"), fake, system="Be brief.")


def test_the_calibration_converges_and_the_budget_holds_for_a_denser_tokenizer(
    make_proxy, fake, agents_dir
):
    proxy, session = dense_session(make_proxy, fake, agents_dir, 1.5)
    factors = []
    # a long opening message (3,000 real tokens), then 300-token turns: from the second
    # request on the opening no longer fits the real budget and is trimmed
    for turn in range(1, 13):
        session.say(sized(f"U{turn}", 2000 if turn == 1 else 300))
        factors.append(proxy.snapshot("dense", "s").meta.calibration)
    # persisted with each turn: 1.5 and the few tokens the estimate leaves to the format
    assert all(abs(f - 1.5) < 0.03 for f in factors)
    real = [round(1.5 * prompt_tokens(s.messages)) for s in session.sent]
    # the first request is sent before anything is known; every later one fits
    assert all(size <= BUDGET for size in real[1:]), real
    # and the strategy used the factor: the window is trimmed to the real budget, not to
    # 80% of the estimate (which would be 1.5 x 3,200 real tokens)
    estimates = [int(s.headers["x-memory-window-tokens"]) for s in session.sent]
    assert max(estimates[1:]) * factors[-1] <= BUDGET
    assert max(real) > BUDGET - 500  # the budget was reached, not just never approached
    assert real[0] > 3000 and "U1:" not in str(session.sent[1].messages)
    assert session.sent[-1].headers["x-memory-context-modified"] == "true"


def test_a_sparser_tokenizer_lets_the_window_grow_back_gradually(make_proxy, fake, agents_dir):
    proxy, session = dense_session(make_proxy, fake, agents_dir, 0.8)
    factors = []
    for turn in range(1, 9):
        session.say(sized(f"U{turn}", 200))
        factors.append(proxy.snapshot("dense", "s").meta.calibration)
    # blended down a step per turn (an overestimate costs room, never an overflow)
    assert factors == sorted(factors, reverse=True)
    assert 0.9 < factors[0] < 1.0
    assert abs(factors[-1] - 0.8) < 0.05


def test_the_calibrated_budget_lets_fewer_messages_through(make_proxy, fake, agents_dir):
    proxy, session = dense_session(make_proxy, fake, agents_dir, 1.5)
    for turn in range(1, 11):
        session.say(sized(f"U{turn}", 400))
    dense = len(session.sent[-1].messages)
    fake.reset()
    plain = DeltaSession(proxy.client("dense", "plain"), fake, system="Be brief.")
    fake.count_tokens = lambda body: prompt_tokens(body["messages"])
    for turn in range(1, 11):
        plain.say(sized(f"U{turn}", 400))
    assert len(plain.sent[-1].messages) > dense
