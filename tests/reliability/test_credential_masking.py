"""Passwords in the store and upstream URLs never reach a client, a log or the admin: a
``serve`` process configured with ``redis://:PASSWORD@…`` while Redis is down answers its
503s, ``/ready``, ``/memory`` and admin pages with the URL masked, and its log (the
start-up line included) masks it too."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from e2e import CLIENT_KEY
from ports import free_port
from reliability_support import ProxyProcess, is_openai_error

from storage.redact import mask_url

STORE_PASSWORD = "store-pw-9f2c"
UPSTREAM_PASSWORD = "gateway-pw-71ab"
AUTH = {"Authorization": f"Bearer {CLIENT_KEY}"}


def test_mask_url_hides_passwords_and_lone_tokens_but_keeps_the_rest() -> None:
    assert mask_url("redis at redis://:pw@127.0.0.1:6379/0 is unavailable") == (
        "redis at redis://:***@127.0.0.1:6379/0 is unavailable"
    )
    assert mask_url("https://user:p@ss@gw.example/v1") == "https://user:***@gw.example/v1"
    assert mask_url("https://TOKEN@gw.example/v1") == "https://***@gw.example/v1"
    assert mask_url("redis://127.0.0.1:6379/0, mail me at a@b.example") == (
        "redis://127.0.0.1:6379/0, mail me at a@b.example"
    )


def test_store_and_upstream_passwords_are_masked_in_errors_pages_and_logs(
    tmp_path: Path,
) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    down = free_port()  # nothing listens: Redis and the upstream are both down
    log = tmp_path / "proxy.log"
    proxy = ProxyProcess(free_port(), {
        "MEMORY_PROXY_STORE_URL": f"redis://:{STORE_PASSWORD}@127.0.0.1:{down}/0",
        "MEMORY_PROXY_UPSTREAM_URL": f"http://user:{UPSTREAM_PASSWORD}@127.0.0.1:{down}/v1",
        "MEMORY_PROXY_AGENTS_DIR": str(agents),
        "MEMORY_PROXY_LOG_LEVEL": "debug",
    }, log)
    seen: list[str] = []
    try:
        proxy.start()
        chat = f"{proxy.base}/agents/a/sessions/s/v1/chat/completions"
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        for stream in (False, True):
            answer = httpx.post(chat, json={**body, "stream": stream}, headers=AUTH, timeout=30)
            assert answer.status_code == 503 and is_openai_error(answer.json())
            assert "redis://:***@127.0.0.1" in answer.json()["error"]["message"]
            seen.append(answer.text)
        passed = httpx.post(chat, json=body, headers={**AUTH, "X-Memory": "off"}, timeout=30)
        assert passed.status_code == 502 and is_openai_error(passed.json())
        assert "http://user:***@127.0.0.1" in passed.json()["error"]["message"]
        seen.append(passed.text)
        for path in ("/memory/a", "/memory/a/s", "/ready", "/admin/", "/admin/agents/a",
                     "/admin/api/agents", "/admin/api/agents/a/sessions/s"):
            answer = httpx.get(proxy.base + path, timeout=30)
            assert answer.status_code >= 400, path
            seen.append(answer.text)
    finally:
        proxy.stop()
    logged = log.read_text()
    assert re.search(r"store +redis://:\*\*\*@127\.0\.0\.1", logged)  # the start-up line
    for text in [*seen, logged]:
        assert STORE_PASSWORD not in text
        assert UPSTREAM_PASSWORD not in text
