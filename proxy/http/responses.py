"""JSON responses serialized with orjson, and the OpenAI-shaped error handlers."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import ProxyError
from proxy.metrics import inc

logger = logging.getLogger("memory_proxy")

HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error"}


def json_response(
    data: Any, *, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(data), status_code=status_code, media_type="application/json", headers=headers
    )


def error_response(status: int, message: str, error_type: str, code: str | None = None) -> Response:
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return json_response(body, status_code=status)


async def proxy_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    inc("memory_proxy_errors_total", type=exc.error_type)
    return Response(
        exc.body(), status_code=exc.status_code, media_type="application/json", headers=exc.headers
    )


async def http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(
        exc.status_code,
        str(exc.detail),
        HTTP_ERROR_TYPES.get(exc.status_code, "invalid_request_error"),
    )


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    inc("memory_proxy_errors_total", type="server_error")
    return error_response(500, "internal error in memory-proxy", "server_error")
