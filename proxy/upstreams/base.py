"""The Upstream port: how the proxy talks to the real model.

Implementations translate their client library's exceptions into ``proxy.errors``
(``UpstreamStatusError`` for an error status, ``UpstreamConnectError``,
``UpstreamTimeout``) at one seam.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson


@dataclass(slots=True)
class UpstreamRequest:
    """A chat completion call: the body as it goes out (messages already rewritten) and
    the headers to forward (``Authorization`` and any provider headers)."""

    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    def secrets(self, *keys: str | None) -> tuple[str, ...]:
        """What an error passed back must not show: the client's key and ``keys``."""
        return header_secrets(self.headers, *keys)


# the headers whose values are credentials (as forwarded: lower-case names)
CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")


def header_secrets(headers: dict[str, str], *keys: str | None) -> tuple[str, ...]:
    """The credentials among ``headers`` (a Bearer token without its scheme) and ``keys``."""
    found = [key for key in keys if key]
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            found.append(value)
            _scheme, _, token = value.partition(" ")
            if token.strip():
                found.append(token.strip())
    return tuple(found)


@dataclass(slots=True)
class UpstreamResponse:
    status_code: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass(slots=True)
class SSEEvent:
    """One server-sent event as received: ``raw`` is forwarded byte for byte, ``data`` is
    its data payload (``b"[DONE]"`` for the terminator)."""

    raw: bytes
    data: bytes

    @property
    def done(self) -> bool:
        return self.data.strip() == b"[DONE]"


class UpstreamStream(Protocol):
    status_code: int
    headers: dict[str, str]

    def __aiter__(self) -> AsyncIterator[SSEEvent]:
        """Events as they arrive. A cut connection raises ``UpstreamError``.

        A stream may also offer ``ready() -> list[SSEEvent]``: the events it already
        received and not yet iterated, without waiting (they are forwarded together)."""

    async def aclose(self) -> None:
        """Abort the upstream call (client went away) or release the connection."""


class Upstream(Protocol):
    async def start(self) -> None:
        """Open pools (called from the app lifespan)."""

    async def close(self) -> None:
        """Close pools."""

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        """A non-streaming completion; error statuses raise ``UpstreamStatusError``."""

    async def chat_stream(self, request: UpstreamRequest) -> UpstreamStream:
        """Open a streaming completion. Raises ``UpstreamStatusError`` when the upstream
        answers an error status before streaming."""

    async def models(self, headers: dict[str, str]) -> UpstreamResponse:
        """``GET /models`` passed through (any status is returned, not raised)."""
