"""Admin access: a Bearer token or the admin cookie, compared in constant time.

Without ``MEMORY_PROXY_ADMIN_TOKEN`` the admin surfaces answer only on a loopback-bound
proxy to loopback clients; a proxy bound elsewhere refuses them until a token is set.
"""

from __future__ import annotations

import hmac

from starlette.requests import HTTPConnection

from proxy.errors import Forbidden, Unauthorized
from proxy.settings import LOOPBACK_HOSTS, Settings

COOKIE = "mp_admin"


def presented_token(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return conn.cookies.get(COOKIE)


def token_matches(expected: str, presented: str | None) -> bool:
    if presented is None:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


def is_admin(conn: HTTPConnection, settings: Settings) -> bool:
    expected = settings.admin_secret()
    if expected is None:
        # no token: only this machine, asking this machine by name (a DNS-rebound site
        # resolves to 127.0.0.1 too, but names itself in Host)
        client = conn.client.host if conn.client else ""
        host = conn.url.hostname or ""
        return settings.loopback_only and client in LOOPBACK_HOSTS and host in LOOPBACK_HOSTS
    return token_matches(expected, presented_token(conn))


def require_admin(conn: HTTPConnection, settings: Settings) -> None:
    if is_admin(conn, settings):
        return
    if settings.admin_secret() is None:
        raise Forbidden(
            "without MEMORY_PROXY_ADMIN_TOKEN the admin surfaces answer only on a "
            "loopback-bound proxy, to this machine, addressed as localhost or 127.0.0.1",
            code="admin_token_required",
        )
    raise Unauthorized("a valid admin token is required (Authorization: Bearer <token>)")
