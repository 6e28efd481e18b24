"""Who may use /memory and /admin: a token, or, with none configured, this machine only."""

from __future__ import annotations

import hmac
import time

import pytest
from starlette.requests import Request

from proxy.admin import auth
from proxy.errors import Forbidden, Unauthorized
from proxy.settings import Settings


def request(*, client="127.0.0.1", host="127.0.0.1:4000", headers=()) -> Request:
    raw = [(b"host", host.encode()), *((k.encode(), v.encode()) for k, v in headers)]
    scope = {"type": "http", "method": "GET", "path": "/memory/a", "headers": raw,
             "client": (client, 5555), "scheme": "http", "server": ("127.0.0.1", 4000),
             "query_string": b""}
    return Request(scope)


def test_a_valid_bearer_token_or_session_cookie_is_admin():
    settings = Settings(admin_token="s3cret")
    assert auth.is_admin(request(headers=[("authorization", "Bearer s3cret")]), settings)
    cookie = auth.session_cookie("s3cret")
    assert auth.is_admin(request(headers=[("cookie", f"mp_admin={cookie}")]), settings)
    for bad in ("Bearer nope", "Basic s3cret", "Bearer s3cret2", "Bearer"):
        assert not auth.is_admin(request(headers=[("authorization", bad)]), settings)


def test_a_missing_token_is_401_when_one_is_configured():
    with pytest.raises(Unauthorized):
        auth.require_admin(request(client="10.1.2.3"), Settings(admin_token="s3cret"),
                           auth.FailedAttempts(10))


@pytest.mark.parametrize("bind, client, host, allowed", [
    pytest.param("127.0.0.1", "127.0.0.1", "127.0.0.1:4000", True, id="loopback"),
    pytest.param("127.0.0.1", "127.0.0.1", "localhost:4000", True, id="localhost-name"),
    pytest.param("127.0.0.1", "127.0.0.1", "rebound.example:4000", False, id="dns-rebinding"),
    pytest.param("0.0.0.0", "127.0.0.1", "127.0.0.1:4000", False, id="public-bind"),
    pytest.param("127.0.0.1", "192.168.1.5", "127.0.0.1:4000", False, id="remote-client"),
])
def test_without_a_token_only_this_machine_gets_in(bind, client, host, allowed):
    settings = Settings(host=bind)
    assert auth.is_admin(request(client=client, host=host), settings) is allowed
    if not allowed:
        with pytest.raises(Forbidden):
            auth.require_admin(request(client=client, host=host), settings,
                               auth.FailedAttempts(10))


def test_tokens_are_compared_in_constant_time(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert auth.is_admin(request(headers=[("authorization", "Bearer s3cret")]),
                         Settings(admin_token="s3cret"))
    assert calls == [(b"s3cret", b"s3cret")]


def test_the_login_cookie_holds_a_derived_session_value_never_the_token():
    settings = Settings(admin_token="s3cret")
    cookie = auth.session_cookie("s3cret")
    assert "s3cret" not in cookie
    assert not auth.is_admin(request(headers=[("cookie", "mp_admin=s3cret")]), settings)
    assert not auth.is_admin(request(headers=[("cookie", f"mp_admin={cookie}x")]), settings)
    # another token's cookie, and one issued longer ago than the cookie lives, are refused
    other = auth.session_cookie("another")
    assert not auth.is_admin(request(headers=[("cookie", f"mp_admin={other}")]), settings)
    old = auth.session_cookie("s3cret", int(time.time()) - auth.ADMIN_COOKIE_MAX_AGE - 5)
    assert not auth.is_admin(request(headers=[("cookie", f"mp_admin={old}")]), settings)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_wrong_bearer_tokens_past_the_limit_are_429_with_retry_after_per_address():
    settings, clock = Settings(admin_token="s3cret"), Clock()
    failures = auth.FailedAttempts(10, window=60, clock=clock)
    wrong = request(client="10.0.0.9", headers=[("authorization", "Bearer guess")])
    statuses = []
    for _ in range(1000):
        try:
            auth.require_admin(wrong, settings, failures)
        except (Unauthorized, auth.TooManyAttempts) as exc:
            statuses.append(exc.status_code)
    assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}
    right = request(client="10.0.0.9", headers=[("authorization", "Bearer s3cret")])
    with pytest.raises(auth.TooManyAttempts) as refused:  # even the right token waits
        auth.require_admin(right, settings, failures)
    assert refused.value.headers["Retry-After"] == "60"
    # another address is not held back
    auth.require_admin(request(client="10.0.0.8", headers=[("authorization", "Bearer s3cret")]),
                       settings, failures)
    clock.now += 61  # the window is over
    auth.require_admin(right, settings, failures)


def test_failed_attempts_track_a_bounded_number_of_addresses():
    failures = auth.FailedAttempts(10, max_addresses=100)
    for n in range(5000):
        failures.record(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
    assert len(failures) == 100
