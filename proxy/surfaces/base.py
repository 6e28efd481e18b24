"""The Surface port: what an API surface adapter gives the turn pipeline.

A surface (OpenAI chat completions, later Anthropic Messages and OpenAI Responses) is an
adapter around the one pipeline (proxy/turn/pipeline.py). It

- parses its HTTP request into a ``TurnRequest`` (the conversation as chat-format
  messages, the system prompt, model, tools, stream flag, options, identity hints);
- renders the selected window (chat messages, ``Turn.messages``) into the upstream's
  request body for the upstream's API (``api``: ``"chat"``, or ``"messages"`` for
  Anthropic's); a surface whose requests may go to another API than chat completions
  names it per request (optional ``upstream_api(request) -> UpstreamApi``,
  proxy/turn/upstream_api.py), and one that keeps state for one request (a stream's
  translation) returns a per-request copy of itself from optional ``bind(request)``;
- renders the upstream's reply back in its own shape: a whole body (``reply``), or a
  stream one upstream event at a time (``stream_event``) closed by its final event
  (``stream_end``) or an error event (``stream_error``);
- renders any ``ProxyError`` in its own error shape (``error_body``).

The pipeline does the memory work on stored records and rebuilds the reply record from
the upstream's API (proxy/surfaces/chat_reply.py for chat), so a surface never stores
anything itself. See docs/ARCHITECTURE.md, "Adding an API surface".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import ProxyError
from proxy.upstreams.base import SSEEvent, UpstreamResponse

if TYPE_CHECKING:
    from proxy.services import Services
    from proxy.turn.state import Turn, TurnRequest


class Surface(Protocol):
    # the surface's name (metrics, logs)
    name: str
    # the stream's media type
    stream_media_type: str

    async def parse(self, request: Request, services: Services) -> TurnRequest:
        """The request as the pipeline reads it; bad input raises a ``BadRequest``."""

    def error_body(self, exc: ProxyError) -> bytes:
        """``exc`` as a JSON body in the surface's error shape."""

    def upstream_body(
        self, request: TurnRequest, messages: list[dict[str, Any]] | None, api: str,
        turn: Turn | None = None,
    ) -> dict[str, Any]:
        """The body to send to an upstream of API ``api`` with the window ``messages``
        (None: the request forwarded as it came, memory off); ``turn``: the turn whose
        window they are (its records, the prefix changes)."""

    def reply(
        self, turn: Turn | None, response: UpstreamResponse, headers: dict[str, str]
    ) -> Response:
        """A whole upstream reply (``turn`` None: memory off) as the client's response."""

    def stream_event(
        self, turn: Turn | None, chunk: dict[str, Any] | None, event: SSEEvent
    ) -> bytes | None:
        """What the client receives for one upstream event (``chunk``: its parsed data
        when the pipeline reads the reply, else None); None sends nothing."""

    def stream_end(self, turn: Turn | None) -> bytes:
        """The stream's final event, sent after the turn is stored."""

    def stream_error(self, exc: ProxyError) -> bytes:
        """The event that ends a stream that failed."""
