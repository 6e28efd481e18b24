"""Anthropic's Messages API (or any server that speaks it) on aiohttp.

The same client as the OpenAI-compatible path (``OpenAIUpstream``: one pooled session,
``trust_env``, TLS settings, redirects, timeouts, error seam), at other URLs:
``POST {base}/v1/messages`` (JSON or Anthropic's stream events) and
``POST {base}/v1/messages/count_tokens``, with the client's query string (Claude Code's
``?beta=true``) passed on.

Credentials: with ``api_key`` set, it goes as ``x-api-key`` and the client's
``x-api-key`` and ``Authorization`` stay at the proxy; without, the client's headers are
forwarded as sent (an API key or an OAuth ``Authorization: Bearer``). ``anthropic-version``
and ``anthropic-beta`` are forwarded; a request without a version gets ``2023-06-01``.
"""

from __future__ import annotations

import asyncio

from proxy.upstreams.base import SSEEvent, UpstreamRequest, UpstreamResponse
from proxy.upstreams.openai_http import OpenAIStream, OpenAIUpstream, _headers_of, _min

__all__ = ["ANTHROPIC_VERSION", "AnthropicStream", "AnthropicUpstream"]

ANTHROPIC_VERSION = "2023-06-01"


class AnthropicStream(OpenAIStream):
    """A streamed reply; its last event is ``message_stop`` (or ``error``)."""

    @staticmethod
    def _ends(event: SSEEvent) -> bool:
        data = event.data
        return data.startswith(b'{"type":"message_stop"') or data.startswith(
            b'{"type": "message_stop"')


class AnthropicUpstream(OpenAIUpstream):
    """``POST {base_url}/v1/messages`` and ``/v1/messages/count_tokens``."""

    def __init__(self, base_url: str, *, api_key: str | None = None, **kwargs: object) -> None:
        super().__init__(base_url, **kwargs)  # type: ignore[arg-type]
        root = self.base_url.removesuffix("/v1")
        self.api_key = api_key
        self._authorization = None
        self._anthropic_key = api_key
        self._messages_url = f"{root}/v1/messages"
        self._count_url = f"{root}/v1/messages/count_tokens"
        self._models_url = f"{root}/v1/models"

    def _headers(self, headers: dict[str, str], json_body: bool) -> dict[str, str]:
        out = super()._headers(headers, json_body)
        if self._anthropic_key is not None:
            out.pop("authorization", None)
            out["x-api-key"] = self._anthropic_key
        out.setdefault("anthropic-version", ANTHROPIC_VERSION)
        return out

    @staticmethod
    def _with_query(url: str, query: str) -> str:
        return f"{url}?{query}" if query else url

    async def messages(self, request: UpstreamRequest, query: str = "") -> UpstreamResponse:
        """A whole reply; an error status raises ``UpstreamStatusError``."""
        body = request.body
        if body.get("stream"):
            body = {k: v for k, v in body.items() if k != "stream"}
        return await self._call(request, body, self._with_query(self._messages_url, query))

    async def count_tokens(self, request: UpstreamRequest, query: str = "") -> UpstreamResponse:
        return await self._call(request, request.body, self._with_query(self._count_url, query))

    async def _call(self, request: UpstreamRequest, body: dict[str, object], url: str
                    ) -> UpstreamResponse:
        deadline = asyncio.get_running_loop().time() + self._timeout
        response = await self._post(
            request, body, _min(self._timeout, self.first_byte_timeout), deadline, url
        )
        data = await self._read(response, url, self._remaining(deadline))
        return UpstreamResponse(response.status, data, _headers_of(response))

    async def messages_stream(self, request: UpstreamRequest, query: str = "") -> AnthropicStream:
        """Open a streamed reply; an error status before the stream raises."""
        body = request.body
        if body.get("stream") is not True:
            body = {**body, "stream": True}
        url = self._with_query(self._messages_url, query)
        header_timeout = _min(self._timeout, self.first_byte_timeout)
        deadline = asyncio.get_running_loop().time() + self._timeout
        response = await self._post(request, body, header_timeout, deadline, url)
        return AnthropicStream(response, url, self._timeout, self.first_byte_timeout)
