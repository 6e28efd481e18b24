"""Anthropic's error shape: an error body and the stream's ``error`` event."""

from __future__ import annotations

import orjson

from proxy.errors import ProxyError, UpstreamStatusError

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(exc: ProxyError) -> bytes:
    """``exc`` in Anthropic's shape: an Anthropic error from the upstream as it came (its
    secrets masked), any other with the type Anthropic gives its status."""
    message = exc.message
    if isinstance(exc, UpstreamStatusError):
        try:
            data = orjson.loads(exc.raw_body)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict) and data.get("type") == "error" and isinstance(
            data.get("error"), dict
        ):
            return exc.raw_body
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]  # an OpenAI-shaped error of a translated upstream
        elif exc.raw_body:
            message = exc.raw_body.decode("utf-8", "replace")[:2000]
    return orjson.dumps({"type": "error", "error": {
        "type": error_type(exc.status_code), "message": message}})


def error_event(body: bytes) -> bytes:
    return b"event: error\ndata: " + body + b"\n\n"
