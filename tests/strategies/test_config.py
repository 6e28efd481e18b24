"""memoryConfig: the spec's names and defaults; bad input rejected with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from strategies.config import (
    AutoCompactConfig,
    MemoryConfigError,
    SummarizingWindowConfig,
    parse_memory_config,
)

# the spec's reference objects (spec/memory-strategies.txt, "Strategy reference"), verbatim
SPEC_SUMMARIZING_WINDOW = {
    "kind": "summarizing_window",
    "maxConversationRatio": 0.80,
    "maxMessageRatio": 0.20,
    "compressToolResults": True,
    "minToolResultCompressTokens": 500,
    "toolResultThresholdRatio": 0.02,
    "compressWhenWindowAboveRatio": 0.50,
    "autoSummarize": False,
    "autoSummarizeRatio": 0.75,
    "summaryPlacement": "SYSTEM_PROMPT",
    "maxHistoryFetch": 500,
}
SPEC_AUTO_COMPACT = {
    "kind": "auto_compact",
    "compactAtRatio": 0.80,
    "summaryPlacement": "USER_MESSAGE",
    "toolResultEviction": {"afterTurns": 1, "aboveTokens": 500},
}
SPEC_WINDOWED = {"kind": "windowed", "windowSize": 20}
SPEC_FULL = {"kind": "full", "maxHistoryFetch": 500}
SPEC_NONE = {"kind": "none"}

# knobs beyond the spec (docs/MEMORY.md, "Keeping the prompt cache warm")
SUMMARIZING_WINDOW_EXTENSIONS = {"stablePrefix": "auto", "trimTargetShare": 0.3}
WINDOWED_EXTENSIONS = {"windowStep": 1}
EXTENSIONS = {"summarizing_window": SUMMARIZING_WINDOW_EXTENSIONS,
              "windowed": WINDOWED_EXTENSIONS}

# the defaults tables: toolResultEviction is null (off) unless given
SPEC_DEFAULTS = {
    "summarizing_window": {**SPEC_SUMMARIZING_WINDOW, **SUMMARIZING_WINDOW_EXTENSIONS},
    "auto_compact": {**SPEC_AUTO_COMPACT, "toolResultEviction": None},
    "windowed": {**SPEC_WINDOWED, **WINDOWED_EXTENSIONS},
    "full": SPEC_FULL,
    "none": SPEC_NONE,
}


@pytest.mark.parametrize("kind", list(SPEC_DEFAULTS))
def test_each_kind_parses_with_the_spec_defaults(kind):
    assert parse_memory_config({"kind": kind}).to_dict() == SPEC_DEFAULTS[kind]


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(SPEC_SUMMARIZING_WINDOW, id="summarizing_window"),
        pytest.param(SPEC_AUTO_COMPACT, id="auto_compact"),
        pytest.param(SPEC_WINDOWED, id="windowed"),
        pytest.param(SPEC_FULL, id="full"),
        pytest.param(SPEC_NONE, id="none"),
    ],
)
def test_the_spec_examples_parse_and_round_trip(example):
    parsed = parse_memory_config(example).to_dict()
    assert parsed == {**example, **EXTENSIONS.get(example["kind"], {})}


def test_no_config_means_summarizing_window_defaults():
    config = parse_memory_config(None)
    assert isinstance(config, SummarizingWindowConfig)
    assert config.to_dict() == {**SPEC_SUMMARIZING_WINDOW, **SUMMARIZING_WINDOW_EXTENSIONS}


def test_an_empty_eviction_object_gets_the_eviction_defaults():
    config = parse_memory_config({"kind": "auto_compact", "toolResultEviction": {}})
    assert isinstance(config, AutoCompactConfig)
    assert config.toolResultEviction is not None
    assert (config.toolResultEviction.afterTurns, config.toolResultEviction.aboveTokens) == (1, 500)


def test_an_int_is_accepted_for_a_ratio():
    config = parse_memory_config({"kind": "auto_compact", "compactAtRatio": 1})
    assert isinstance(config, AutoCompactConfig)
    assert config.compactAtRatio == 1.0


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param({"kind": "windowed", "windowSize": 5, "bogus": 1}, "bogus", id="unknown"),
        pytest.param({"kind": "none", "windowSize": 5}, "windowSize", id="other-kinds-field"),
        pytest.param(
            {"kind": "auto_compact", "toolResultEviction": {"afterTurn": 1}},
            "toolResultEviction.afterTurn",
            id="unknown-nested",
        ),
        pytest.param({"kind": "windowed", "windowSize": "20"}, "windowSize", id="string-for-int"),
        pytest.param({"kind": "windowed", "windowSize": 2.5}, "windowSize", id="float-for-int"),
        pytest.param({"kind": "windowed", "windowSize": True}, "windowSize", id="bool-for-int"),
        pytest.param({"kind": "windowed", "windowSize": 0}, "windowSize", id="window-of-zero"),
        pytest.param(
            {"kind": "auto_compact", "compactAtRatio": "0.8"}, "compactAtRatio", id="str-ratio"
        ),
        pytest.param(
            {"kind": "summarizing_window", "autoSummarize": 1}, "autoSummarize", id="int-for-bool"
        ),
        pytest.param(
            {"kind": "summarizing_window", "compressToolResults": "true"},
            "compressToolResults",
            id="string-for-bool",
        ),
        pytest.param(
            {"kind": "auto_compact", "toolResultEviction": {"afterTurns": "1"}},
            "toolResultEviction.afterTurns",
            id="nested-wrong-type",
        ),
        pytest.param(
            {"kind": "auto_compact", "toolResultEviction": 5}, "toolResultEviction", id="not-object"
        ),
        pytest.param({"kind": "auto_compact", "compactAtRatio": 1.5}, "compactAtRatio", id="1.5"),
        pytest.param({"kind": "auto_compact", "compactAtRatio": 0}, "compactAtRatio", id="zero"),
        pytest.param(
            {"kind": "summarizing_window", "maxMessageRatio": -0.1}, "maxMessageRatio", id="neg"
        ),
        pytest.param(
            {"kind": "summarizing_window", "summaryPlacement": "SYSTEM"},
            "summaryPlacement",
            id="placement",
        ),
        pytest.param({"kind": "full", "maxHistoryFetch": 0}, "maxHistoryFetch", id="fetch-zero"),
        pytest.param({"windowSize": 5}, "kind", id="no-kind"),
        pytest.param({"kind": "sliding"}, "kind", id="unknown-kind"),
    ],
)
def test_bad_config_is_rejected_naming_the_field(data: dict[str, Any], field: str):
    with pytest.raises(MemoryConfigError) as caught:
        parse_memory_config(data)
    assert caught.value.field == f"memoryConfig.{field}"
    assert f"memoryConfig.{field}" in str(caught.value)


@pytest.mark.parametrize("data", [[], "windowed", 20])
def test_a_config_that_is_not_an_object_is_rejected(data):
    with pytest.raises(MemoryConfigError, match="JSON object"):
        parse_memory_config(data)
