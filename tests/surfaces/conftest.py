"""The Responses API surface end to end: each test runs against a fake Responses upstream
(reasoning items with opaque ``encrypted_content`` in every reply) and against a fake
chat-completions-only upstream (which answers ``/responses`` with 404: the proxy then
translates)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy.testing.fake_responses import FakeResponsesUpstream
from proxy.testing.fake_upstream import FakeUpstream


@pytest.fixture(params=["responses-upstream", "chat-upstream"])
def fake(request: pytest.FixtureRequest) -> Iterator[FakeUpstream]:
    upstream = (
        FakeResponsesUpstream(reasoning=True)
        if request.param == "responses-upstream"
        else FakeUpstream()
    )
    with upstream:
        yield upstream


@pytest.fixture(params=["sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path}/memory.db"
