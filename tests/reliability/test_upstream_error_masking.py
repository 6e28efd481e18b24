"""An upstream's error that echoes the key it was sent reaches the client with the key
masked: its status and OpenAI shape kept, the key (the client's, or the proxy's own
upstream key) and any ``sk-…`` or ``Bearer …`` string replaced by ``***``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2e import RunningProxy
from reliability_support import is_openai_error

from proxy.testing.fake_upstream import FakeUpstream, Reply, error_json

CLIENT_SECRET = "client-own-key-4d2f91"
UPSTREAM_SECRET = "sk-upstream-own-key-88ab01cd"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/memory.db"


ECHOES = [
    pytest.param(401, "Incorrect API key provided: Bearer {key}. See your keys.",
                 id="bearer-echo"),
    pytest.param(401, "Incorrect API key provided: {key}", id="bare-key-echo"),
    pytest.param(403, "key sk-proj-abcdef123456789 is not allowed here", id="other-sk-key"),
    pytest.param(500, "upstream failed for {key}", id="5xx-echo"),
]


@pytest.mark.parametrize("status, message", ECHOES)
@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_error_echoing_the_client_key_is_masked(
    proxy: RunningProxy, fake: FakeUpstream, status: int, message: str, stream: bool
) -> None:
    fake.queue(Reply.error(status, error_json(status, message.format(key=CLIENT_SECRET))))
    response = httpx.post(
        f"{proxy.url('a', 's')}/chat/completions",
        headers={"Authorization": f"Bearer {CLIENT_SECRET}"},
        json={"model": "gpt-4o", "stream": stream,
              "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    text = response.text
    assert CLIENT_SECRET not in text and "sk-proj-abcdef" not in text
    assert "***" in text
    if stream:  # the error arrives as the stream's error event
        assert response.status_code in (200, status)
    else:
        assert response.status_code == status
        assert is_openai_error(response.json())


def test_an_upstream_error_echoing_the_proxys_own_upstream_key_is_masked(
    make_proxy: Callable[..., RunningProxy], fake: FakeUpstream
) -> None:
    proxy = make_proxy(upstream_api_key=UPSTREAM_SECRET)
    fake.queue(Reply.error(401, error_json(401, f"Incorrect key: {UPSTREAM_SECRET[:-2]}x")))
    fake.queue(Reply.error(401, error_json(401, f"your key {UPSTREAM_SECRET} was revoked")))
    for _ in range(2):
        response = httpx.post(
            f"{proxy.url('a', 's')}/chat/completions", headers={"Authorization": "Bearer c"},
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30)
        assert response.status_code == 401 and is_openai_error(response.json())
        assert "sk-upstream" not in response.text and "***" in response.text
