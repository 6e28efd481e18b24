"""Every error of the proxy, rendered by the one exception handler table
(proxy/http/responses.py) in the shape of the API surface that was called (OpenAI's
``{"error": {...}}`` by default). Errors of the layers below (the store's
``StoreUnavailable``) become a ``ProxyError`` at one seam, ``as_proxy_error``.

ProxyError
 ├── BadRequest (400, invalid_request_error)
 │    ├── InvalidMemoryConfig (400, param names the field)
 │    └── UnsupportedMediaType (415, the admin API's non-JSON body)
 ├── Unauthorized (401, authentication_error)
 ├── Forbidden (403, permission_error)
 ├── TooManySessions (403, a new session past MEMORY_PROXY_MAX_SESSIONS_PER_KEY)
 ├── NotFound (404, not_found_error)
 ├── AmbiguousSession (409, a session id found under several keys)
 ├── CompactConflict (409, nothing the strategy can compact)
 ├── PayloadTooLarge (413, invalid_request_error)
 ├── TooManyAttempts (429, admin authentication failures)
 ├── HeadersTooLarge (431, forwarded headers past MEMORY_PROXY_MAX_FORWARDED_HEADER_BYTES)
 ├── ClientDisconnected (499, the client went away; nothing is sent)
 ├── StoreUnavailableError (503, service_unavailable, with Retry-After)
 └── UpstreamError
      ├── UpstreamStatusError (the upstream's own status and body, passed through)
      ├── UpstreamConnectError (502)
      ├── UpstreamReplyError (502: a 200 that is not a chat completion)
      ├── UpstreamCut (502: a stream that ended before its reply was complete)
      └── UpstreamTimeout (504)
"""

from __future__ import annotations

from typing import Any

import orjson

from storage.base import StoreUnavailable
from storage.redact import mask_body, mask_secrets


class ProxyError(Exception):
    status_code = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        # a URL in an error (the store's, the upstream's) never shows its password, nor
        # does an error show a key-like string (sk-…, Bearer …)
        message = mask_secrets(message)
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        return orjson.dumps(self.to_dict())


class BadRequest(ProxyError):
    status_code = 400
    error_type = "invalid_request_error"


class InvalidMemoryConfig(BadRequest):
    code = "invalid_memory_config"


class UnsupportedMediaType(BadRequest):
    status_code = 415
    code = "unsupported_media_type"


class Unauthorized(ProxyError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_admin_token"


class Forbidden(ProxyError):
    status_code = 403
    error_type = "permission_error"


class TooManySessions(ProxyError):
    status_code = 403
    error_type = "permission_error"
    code = "too_many_sessions"


class HeadersTooLarge(ProxyError):
    status_code = 431
    error_type = "invalid_request_error"
    code = "request_headers_too_large"


class NotFound(ProxyError):
    status_code = 404
    error_type = "not_found_error"


class AmbiguousSession(ProxyError):
    status_code = 409
    error_type = "conflict_error"
    code = "session_ambiguous"


class CompactConflict(ProxyError):
    status_code = 409
    error_type = "conflict_error"
    code = "compaction_not_possible"


class TooManyAttempts(ProxyError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "too_many_admin_auth_failures"


class ClientDisconnected(ProxyError):
    """The client closed the connection; the answer goes nowhere (nginx's 499)."""

    status_code = 499
    error_type = "client_closed_request"
    code = "client_disconnected"


class PayloadTooLarge(ProxyError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class StoreUnavailableError(ProxyError):
    status_code = 503
    error_type = "service_unavailable"
    code = "memory_store_unavailable"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class UpstreamError(ProxyError):
    status_code = 502
    error_type = "upstream_error"


class UpstreamStatusError(UpstreamError):
    """The upstream answered with an error status: its status and body pass through, with
    key-like strings and the ``secrets`` of the call (the client's key, the upstream's)
    masked: an upstream may echo the key it was sent."""

    def __init__(
        self, message: str, *, status_code: int, body: bytes, content_type: str,
        secrets: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.raw_body = mask_body(body, secrets)
        self.content_type = content_type

    def body(self) -> bytes:
        if self.content_type.startswith("application/json") and self.raw_body:
            return self.raw_body
        # a non-JSON error page: wrap it so clients still get OpenAI's shape
        text = self.raw_body.decode("utf-8", "replace")[:2000] or self.message
        return orjson.dumps(
            {"error": {"message": text, "type": "upstream_error", "param": None,
                       "code": str(self.status_code)}}
        )


class UpstreamConnectError(UpstreamError):
    status_code = 502
    code = "upstream_unreachable"


class UpstreamReplyError(UpstreamError):
    """The upstream answered 200 with something other than a chat completion: junk, an
    error object, a completion or stream without a reply."""

    status_code = 502
    code = "upstream_invalid_reply"


class UpstreamCut(UpstreamError):
    """A stream that ended before its reply was complete (no finish reason)."""

    code = "upstream_stream_cut"


class UpstreamTimeout(UpstreamError):
    status_code = 504
    code = "upstream_timeout"


# what a handler catches to render as a ProxyError (through ``as_proxy_error``)
RENDERED = (ProxyError, StoreUnavailable)


def as_proxy_error(exc: BaseException) -> ProxyError | None:
    """The one seam where errors of the layers below become the proxy's: the store's
    ``StoreUnavailable`` is a 503 with Retry-After. None for anything unexpected."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, StoreUnavailable):
        error = StoreUnavailableError(f"memory store unavailable: {exc}")
        error.__cause__ = exc
        return error
    return None


def proxy_error(exc: BaseException) -> ProxyError:
    """``exc`` (one of ``RENDERED``) as the ProxyError to render."""
    error = as_proxy_error(exc)
    if error is None:
        raise exc
    return error
