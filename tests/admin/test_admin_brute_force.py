"""Guessing the admin token: wrong logins and wrong Bearer tokens past the limit are a 429
with Retry-After for that address (the right token included, until the window ends), and
the login cookie holds a value derived from the token, never the token."""

from __future__ import annotations

import time

import pytest
from admin_support import ADMIN_TOKEN, BEARER, csrf_token_in

ATTEMPTS = 500


async def test_wrong_logins_past_the_limit_are_429_with_retry_after(proxy) -> None:
    page = await proxy.client.get("/admin/login")
    token = csrf_token_in(page.text)
    started = time.monotonic()
    statuses = []
    for n in range(ATTEMPTS):
        response = await proxy.client.post("/admin/login", data={
            "csrf_token": token, "token": f"guess-{n}"})
        statuses.append(response.status_code)
    elapsed = time.monotonic() - started
    assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}
    assert 1 <= int(response.headers["retry-after"]) <= 60
    right = await proxy.client.post("/admin/login", data={
        "csrf_token": token, "token": ADMIN_TOKEN})
    assert right.status_code == 429 and "mp_admin" not in right.headers.get("set-cookie", "")
    print(f"\n[reliability] admin login guesses: attempts={ATTEMPTS} "
          f"refused_429={statuses.count(429)} seconds={elapsed:.2f}")


@pytest.mark.parametrize("path", ["/admin/api/agents", "/memory/helper", "/admin/"])
async def test_wrong_bearer_tokens_past_the_limit_are_429_with_retry_after(proxy, path) -> None:
    statuses = []
    for n in range(ATTEMPTS if path == "/admin/api/agents" else 30):
        response = await proxy.client.get(path, headers={"Authorization": f"Bearer guess-{n}"})
        statuses.append(response.status_code)
    assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert (await proxy.client.get(path, headers=BEARER)).status_code == 429


async def test_the_login_cookie_is_not_the_admin_token(proxy) -> None:
    await proxy.sign_in()
    cookie = proxy.client.cookies.get("mp_admin")
    assert cookie and ADMIN_TOKEN not in cookie
    assert (await proxy.client.get("/admin/")).status_code == 200
    proxy.client.cookies.set("mp_admin", ADMIN_TOKEN, path="/admin")  # the raw token
    assert (await proxy.client.get("/admin/")).status_code == 401
