"""Admin access: a Bearer token or the admin cookie, compared in constant time.

Without ``MEMORY_PROXY_ADMIN_TOKEN`` the admin surfaces answer only on a loopback-bound
proxy to loopback clients; a proxy bound elsewhere refuses them until a token is set.

The login cookie never holds the token: it holds the time it was issued and an HMAC of
that time under a key derived from the token (``session_cookie``), valid for
``ADMIN_COOKIE_MAX_AGE``. A wrong token (Bearer header or login form) counts as a
failure of the client's address (``FailedAttempts``): past the limit, every admin
authentication from that address is a 429 with ``Retry-After`` until its window ends.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.requests import HTTPConnection

from proxy.errors import Forbidden, TooManyAttempts, Unauthorized
from proxy.settings import LOOPBACK_HOSTS, Settings

COOKIE = "mp_admin"
ADMIN_COOKIE_MAX_AGE = 12 * 3600
# failed attempts of one address are counted over this window
FAILURE_WINDOW_SECONDS = 60.0
# addresses whose failures are tracked at once (the least recently failing forgotten first)
MAX_TRACKED_ADDRESSES = 10_000


class FailedAttempts:
    """Failed admin authentications per client address, in memory (one process): after
    ``limit`` failures within ``window`` seconds of the first, the address is refused until
    that window ends. Bounded: at most ``max_addresses`` addresses are tracked."""

    def __init__(
        self,
        limit: int,
        window: float = FAILURE_WINDOW_SECONDS,
        max_addresses: int = MAX_TRACKED_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self.max_addresses = max_addresses
        self._clock = clock
        # address -> (start of its window, failures in it)
        self._failures: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def _current(self, address: str) -> tuple[float, int] | None:
        entry = self._failures.get(address)
        if entry is not None and entry[0] + self.window <= self._clock():
            del self._failures[address]
            return None
        return entry

    def check(self, address: str) -> None:
        """Raise ``TooManyAttempts`` while ``address`` is over the limit."""
        if self.limit <= 0:
            return
        entry = self._current(address)
        if entry is not None and entry[1] >= self.limit:
            wait = max(1, math.ceil(entry[0] + self.window - self._clock()))
            raise TooManyAttempts(
                f"too many failed admin authentications from this address; retry in {wait} s",
                headers={"Retry-After": str(wait)},
            )

    def record(self, address: str) -> None:
        if self.limit <= 0:
            return
        entry = self._current(address)
        start, count = entry if entry is not None else (self._clock(), 0)
        self._failures[address] = (start, count + 1)
        self._failures.move_to_end(address)
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)


def client_address(conn: HTTPConnection) -> str:
    return conn.client.host if conn.client else ""


def _session_key(token: str) -> bytes:
    return hashlib.sha256(b"memory-proxy admin session|" + token.encode()).digest()


def session_cookie(token: str, issued: int | None = None) -> str:
    """The login cookie's value: ``issued.HMAC(key(token), issued)``, never the token."""
    issued = int(time.time()) if issued is None else issued
    mac = hmac.new(_session_key(token), str(issued).encode(), hashlib.sha256).hexdigest()
    return f"{issued}.{mac}"


def session_cookie_valid(token: str, value: str) -> bool:
    issued, _, _mac = value.partition(".")
    if not issued.isdigit() or not 0 <= time.time() - int(issued) <= ADMIN_COOKIE_MAX_AGE:
        return False
    return hmac.compare_digest(session_cookie(token, int(issued)).encode(), value.encode())


def bearer_token(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return None


def token_matches(expected: str, presented: str | None) -> bool:
    if presented is None:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


def is_admin(conn: HTTPConnection, settings: Settings) -> bool:
    expected = settings.admin_secret()
    if expected is None:
        # no token: only this machine, asking this machine by name (a DNS-rebound site
        # resolves to 127.0.0.1 too, but names itself in Host)
        client = client_address(conn)
        host = conn.url.hostname or ""
        return settings.loopback_only and client in LOOPBACK_HOSTS and host in LOOPBACK_HOSTS
    bearer = bearer_token(conn)
    if bearer is not None:
        return token_matches(expected, bearer)
    cookie = conn.cookies.get(COOKIE)
    return cookie is not None and session_cookie_valid(expected, cookie)


def admitted(conn: HTTPConnection, settings: Settings, failures: FailedAttempts) -> bool:
    """``is_admin``, counted: raises ``TooManyAttempts`` while the client's address is over
    its limit of failures, and a wrong Bearer token is one more. (A cookie is not counted:
    guessing one is guessing an HMAC, and a browser's expired cookie is no attack.)"""
    if settings.admin_secret() is None:
        return is_admin(conn, settings)
    address = client_address(conn)
    failures.check(address)
    if is_admin(conn, settings):
        return True
    if bearer_token(conn) is not None:
        failures.record(address)
    return False


def require_admin(conn: HTTPConnection, settings: Settings, failures: FailedAttempts) -> None:
    if admitted(conn, settings, failures):
        return
    if settings.admin_secret() is None:
        raise Forbidden(
            "without MEMORY_PROXY_ADMIN_TOKEN the admin surfaces answer only on a "
            "loopback-bound proxy, to this machine, addressed as localhost or 127.0.0.1",
            code="admin_token_required",
        )
    raise Unauthorized("a valid admin token is required (Authorization: Bearer <token>)")
