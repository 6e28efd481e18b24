"""get_strategy: one shared instance per kind; an unknown kind names the known ones."""

from __future__ import annotations

import pytest

from strategies.full import FullStrategy
from strategies.none import NoneStrategy
from strategies.registry import STRATEGIES, UnknownStrategyError, get_strategy
from strategies.windowed import WindowedStrategy


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        pytest.param("windowed", WindowedStrategy, id="windowed"),
        pytest.param("full", FullStrategy, id="full"),
        pytest.param("none", NoneStrategy, id="none"),
    ],
)
def test_get_strategy_returns_one_shared_instance_of_the_kind(kind, cls):
    strategy = get_strategy(kind)
    assert isinstance(strategy, cls)
    assert strategy.kind == kind
    assert get_strategy(kind) is strategy


def test_every_config_kind_has_a_strategy():
    from strategies.config import KINDS

    assert set(STRATEGIES) == set(KINDS)


@pytest.mark.parametrize("kind", ["summarizing_window", "auto_compact"])
def test_the_summarizing_kinds_load_on_demand(kind):
    pytest.importorskip(STRATEGIES[kind].partition(":")[0])
    assert get_strategy(kind).kind == kind


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(UnknownStrategyError, match=r"'sliding'.*windowed") as caught:
        get_strategy("sliding")
    assert isinstance(caught.value, KeyError)
    assert isinstance(caught.value, ValueError)
