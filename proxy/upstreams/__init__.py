"""Upstream clients: the port (``base``) and its implementations.

The implementations are loaded on first access so that importing the port does not import
the HTTP client (or litellm, which is slow) and so that ``proxy.upstreams.sse`` can import ``base``
freely.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from proxy.upstreams.base import (
    SSEEvent,
    Upstream,
    UpstreamRequest,
    UpstreamResponse,
    UpstreamStream,
)

if TYPE_CHECKING:
    from proxy.upstreams.litellm_upstream import LitellmUpstream
    from proxy.upstreams.openai_http import OpenAIUpstream
    from proxy.upstreams.router import RoutedUpstream

__all__ = [
    "LitellmUpstream",
    "OpenAIUpstream",
    "RoutedUpstream",
    "SSEEvent",
    "Upstream",
    "UpstreamRequest",
    "UpstreamResponse",
    "UpstreamStream",
]

_LAZY = {
    "OpenAIUpstream": "proxy.upstreams.openai_http",
    "LitellmUpstream": "proxy.upstreams.litellm_upstream",
    "RoutedUpstream": "proxy.upstreams.router",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
