"""A path with a trailing slash is served as the path without it, never redirected: a 307
would take its Location from the client's Host header."""

from __future__ import annotations

import httpx
import pytest
from e2e import ADMIN_TOKEN, CLIENT_KEY, RunningProxy

BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}
AUTH = {"Authorization": f"Bearer {CLIENT_KEY}", "Host": "evil.example"}


@pytest.fixture
def store_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/memory.db"


@pytest.mark.parametrize("path", [
    "/v1/chat/completions/",
    "/chat/completions/",
    "/agents/a/v1/chat/completions/",
    "/agents/a/sessions/s/v1/chat/completions/",
])
def test_a_chat_path_with_a_trailing_slash_is_served_not_redirected(
    proxy: RunningProxy, path: str
) -> None:
    response = httpx.post(proxy.base + path, json=BODY, headers=AUTH, timeout=20)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"
    if "/sessions/s/" in path:
        assert [m.role for m in proxy.stored("a", "s")] == ["user", "assistant"]


@pytest.mark.parametrize("path", [
    "/v1/models/", "/agents/a/sessions/s/v1/models/", "/health/", "/ready/", "/memory/a/",
])
def test_other_api_paths_with_a_trailing_slash_are_served_not_redirected(
    proxy: RunningProxy, path: str
) -> None:
    response = httpx.get(proxy.base + path, timeout=20, headers={
        "Authorization": f"Bearer {ADMIN_TOKEN}" if path.startswith("/memory") else
        f"Bearer {CLIENT_KEY}"})
    assert response.status_code == 200, (path, response.status_code, response.text)


def test_the_admin_root_redirects_to_a_relative_location(proxy: RunningProxy) -> None:
    response = httpx.get(proxy.base + "/admin", headers={"Host": "evil.example"})
    assert response.status_code == 307
    assert response.headers["location"] == "/admin/"
