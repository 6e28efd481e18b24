"""Backends by URL scheme, imported on demand (``redis`` only when configured)."""

from __future__ import annotations

import importlib

from storage.base import Store

BACKENDS = {
    "sqlite": "storage.sqlite:SqliteStore",
    "redis": "storage.redis:RedisStore",
    "rediss": "storage.redis:RedisStore",
    "redis+cluster": "storage.redis:RedisStore",
    "rediss+cluster": "storage.redis:RedisStore",
    "redis+sentinel": "storage.redis:RedisStore",
}


def open_store(url: str) -> Store:
    """Build (not yet open) the store for ``url``: ``sqlite:///path``, ``redis://host:port/db``,
    ``redis+cluster://host:port`` or ``redis+sentinel://host:port/service/db``."""
    scheme = url.split("://", 1)[0].lower()
    if scheme not in BACKENDS:
        raise ValueError(f"unsupported store URL scheme {scheme!r}; use sqlite://, redis://, "
                         "redis+cluster:// or redis+sentinel://")
    module_name, _, attr = BACKENDS[scheme].partition(":")
    backend = getattr(importlib.import_module(module_name), attr)
    return backend(url)  # type: ignore[no-any-return]
