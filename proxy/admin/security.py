"""Browser-facing safety of the admin UI: response headers, the login cookie, CSRF.

CSRF uses a double-submit cookie bound to the server: ``mp_csrf`` holds a random nonce,
forms carry ``HMAC(key, nonce)`` where the key comes from the admin token, and a post is
accepted only when the two agree (compared in constant time). A cross-site page can
neither read the cookie nor compute the token. JSON twins called with a Bearer header
need no token: a browser never attaches that header on its own.

Every state-changing request under ``/admin`` (the Compact action, session deletes, agent
edits, form posts) first passes ``CrossSiteWrites``: one a browser sent from another site
(``Sec-Fetch-Site: cross-site``, a foreign ``Origin``, or a JSON route posted with a form
content type without a Bearer header) is refused with a 403 before any route runs. That
matters most without an admin token, where loopback is the only credential.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.admin.auth import ADMIN_COOKIE_MAX_AGE, session_cookie
from proxy.admin.auth import COOKIE as ADMIN_COOKIE
from proxy.errors import Forbidden
from proxy.settings import LOOPBACK_HOSTS, Settings

CSRF_COOKIE = "mp_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
COOKIE_PATH = "/admin"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
)
SECURITY_HEADERS: Mapping[str, str] = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


class CsrfFailed(Forbidden):
    code = "csrf_failed"


class SecurityHeaders:
    """ASGI wrapper: every admin response (pages, JSON, static files) carries the headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [
                    (name.encode(), value.encode())
                    for name, value in SECURITY_HEADERS.items()
                    if name.encode() not in present
                ]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def is_https(conn: HTTPConnection) -> bool:
    return conn.url.scheme == "https"


def _csrf_key(settings: Settings) -> bytes:
    secret = settings.admin_secret()
    if secret is None:
        # loopback-only mode has no secret to bind to: the token is still a double submit
        # of an HttpOnly SameSite=Strict cookie, and the Origin check below applies
        secret = f"loopback|{settings.store_url}|{settings.agents_dir}"
    return hashlib.sha256(b"memory-proxy admin csrf|" + secret.encode()).digest()


def csrf_token_for(nonce: str, settings: Settings) -> str:
    return hmac.new(_csrf_key(settings), nonce.encode(), hashlib.sha256).hexdigest()


class CsrfState:
    """The nonce of this browser (new if it had none) and the form token derived from it."""

    def __init__(self, conn: HTTPConnection, settings: Settings) -> None:
        existing = conn.cookies.get(CSRF_COOKIE)
        self.is_new = not existing
        self.nonce = existing or secrets.token_urlsafe(32)
        self.token = csrf_token_for(self.nonce, settings)
        self.secure = is_https(conn)

    def set_cookie(self, response: Response) -> None:
        if self.is_new:
            response.set_cookie(
                CSRF_COOKIE, self.nonce, path=COOKIE_PATH, httponly=True,
                samesite="strict", secure=self.secure,
            )


def check_origin(conn: HTTPConnection) -> None:
    """A browser says where a post came from; a post from another site is refused.

    ``Origin: null`` is what a same-origin form sends under ``Referrer-Policy:
    no-referrer``, so it proves nothing either way; ``Sec-Fetch-Site`` still tells.
    """
    site = conn.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise CsrfFailed("the request came from another site")
    origin = conn.headers.get("origin")
    if origin is None or origin == "null":
        return
    if urlsplit(origin).netloc.lower() != conn.headers.get("host", "").lower():
        raise CsrfFailed("the request came from another site")


UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# what a page of another site can send without a CORS preflight
SIMPLE_CONTENT_TYPES = frozenset(
    {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"}
)


def check_write(conn: HTTPConnection) -> None:
    """Refuse a state-changing admin request that a browser may have sent from another
    site. The JSON routes (``/admin/api/``) also refuse a form-like body without a Bearer
    header: only a cross-site page would send one there."""
    check_origin(conn)
    if not conn.url.path.startswith("/admin/api/"):
        return  # the HTML forms carry a CSRF token, verified by their route
    if conn.headers.get("authorization", "").lower().startswith("bearer "):
        return
    content_type = conn.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in SIMPLE_CONTENT_TYPES:
        raise CsrfFailed(
            "a form-encoded or text/plain write to the admin API is refused; "
            "send JSON (Content-Type: application/json)"
        )


class CrossSiteWrites:
    """ASGI wrapper of the whole app: ``check_write`` for every POST, PUT, PATCH and DELETE
    under ``/admin``, before routing (so no route can forget it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in UNSAFE_METHODS
            and scope["path"].startswith("/admin")
        ):
            try:
                check_write(HTTPConnection(scope))
            except CsrfFailed as exc:
                response = Response(
                    exc.body(), status_code=exc.status_code, media_type="application/json",
                    headers=dict(SECURITY_HEADERS),
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def verify_csrf(conn: HTTPConnection, settings: Settings, presented: object) -> None:
    """Raise ``CsrfFailed`` unless ``presented`` is the token of this browser's nonce."""
    check_origin(conn)
    nonce = conn.cookies.get(CSRF_COOKIE)
    if not nonce or not isinstance(presented, str) or not presented:
        raise CsrfFailed("the form's security token is missing; reload the page and retry")
    expected = csrf_token_for(nonce, settings)
    if not hmac.compare_digest(expected.encode(), presented.encode()):
        raise CsrfFailed("the form's security token does not match; reload the page and retry")


def check_loopback_host(conn: HTTPConnection, settings: Settings) -> None:
    """Without a token the admin trusts loopback clients; a site that rebinds its own name
    to 127.0.0.1 would be one, so the request must also name this machine as its host."""
    if settings.admin_secret() is None and (conn.url.hostname or "") not in LOOPBACK_HOSTS:
        raise Forbidden(
            "without MEMORY_PROXY_ADMIN_TOKEN the admin answers only requests addressed to "
            "localhost or 127.0.0.1",
            code="admin_host_not_loopback",
        )


def set_admin_cookie(response: Response, conn: HTTPConnection, token: str) -> None:
    """The login cookie: a session value derived from the token, never the token."""
    response.set_cookie(
        ADMIN_COOKIE, session_cookie(token), max_age=ADMIN_COOKIE_MAX_AGE, path=COOKIE_PATH,
        httponly=True, samesite="strict", secure=is_https(conn),
    )


def clear_admin_cookie(response: Response, conn: HTTPConnection) -> None:
    response.delete_cookie(
        ADMIN_COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict", secure=is_https(conn)
    )
