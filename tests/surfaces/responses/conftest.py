"""The Responses API surface end to end: each test runs against a fake Responses upstream
(reasoning items with opaque ``encrypted_content`` in every reply) and against a fake
chat-completions-only upstream (which answers ``/responses`` with 404: the proxy then
translates)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from e2e import RunningProxy

from proxy.testing.fake_responses import FakeResponsesUpstream
from proxy.testing.fake_upstream import FakeUpstream


@pytest.fixture(scope="module")
def responses_upstream() -> Iterator[FakeResponsesUpstream]:
    """The module's one fake Responses upstream (``fake`` resets it for each test)."""
    with FakeResponsesUpstream(reasoning=True) as upstream:
        yield upstream


@pytest.fixture(params=["responses-upstream", "chat-upstream"])
def fake(request: pytest.FixtureRequest, fake_upstream: FakeUpstream) -> FakeUpstream:
    upstream: FakeUpstream = (
        request.getfixturevalue("responses_upstream")
        if request.param == "responses-upstream"
        else fake_upstream
    )
    upstream.reset()
    return upstream


@pytest.fixture
def store_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    # the store contract is the store suite's (tests/storage): these run on the embedded store
    return f"sqlite:///{tmp_path}/memory.db"


@pytest.fixture
def proxy(make_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return make_proxy()
