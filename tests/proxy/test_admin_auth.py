"""Who may use /memory and /admin: a token, or, with none configured, this machine only."""

from __future__ import annotations

import hmac

import pytest
from starlette.requests import Request

from proxy import auth
from proxy.errors import Forbidden, Unauthorized
from proxy.settings import Settings


def request(*, client="127.0.0.1", host="127.0.0.1:4000", headers=()) -> Request:
    raw = [(b"host", host.encode()), *((k.encode(), v.encode()) for k, v in headers)]
    scope = {"type": "http", "method": "GET", "path": "/memory/a", "headers": raw,
             "client": (client, 5555), "scheme": "http", "server": ("127.0.0.1", 4000),
             "query_string": b""}
    return Request(scope)


def test_a_valid_bearer_token_or_cookie_is_admin():
    settings = Settings(admin_token="s3cret")
    assert auth.is_admin(request(headers=[("authorization", "Bearer s3cret")]), settings)
    assert auth.is_admin(request(headers=[("cookie", "mp_admin=s3cret")]), settings)
    for bad in ("Bearer nope", "Basic s3cret", "Bearer s3cret2", "Bearer"):
        assert not auth.is_admin(request(headers=[("authorization", bad)]), settings)


def test_a_missing_token_is_401_when_one_is_configured():
    with pytest.raises(Unauthorized):
        auth.require_admin(request(client="10.1.2.3"), Settings(admin_token="s3cret"))


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
            auth.require_admin(request(client=client, host=host), settings)


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
