"""The Messages surface's end-to-end fixtures: the fake upstream serves Anthropic's Messages
API besides chat completions, and the proxy sends Claude models to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e import RunningProxy

from proxy.testing.fake_messages import FakeMessages


@pytest.fixture
def fake() -> Iterator[FakeMessages]:
    with FakeMessages.running() as upstream:
        yield upstream


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    # the store contract is the store suite's: these tests run on the embedded store
    return f"sqlite:///{tmp_path}/memory.db"


@pytest.fixture
def messages_proxy(
    make_proxy: Callable[..., RunningProxy], fake: FakeMessages
) -> Callable[..., RunningProxy]:
    def make(**overrides: Any) -> RunningProxy:
        overrides.setdefault("anthropic_url", fake.base_url)
        return make_proxy(**overrides)

    return make


@pytest.fixture
def proxy(messages_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return messages_proxy()
