"""``functools.lru_cache`` for functions of client-chosen strings (model ids, names, keys).

A call with a string argument longer than ``max_chars`` is computed and not remembered:
the cache holds at most ``maxsize`` entries of at most ``max_chars`` characters per
string, so its size in bytes is bounded whatever the clients send. The proxy refuses such
strings at the door (``proxy/http/limits.py``); this is the second line, for strings that come
back from the store or an agent definition.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["MAX_KEY_CHARS", "short_key_cache"]

# as proxy/http/limits.py's MAX_IDENTIFIER_CHARS: every identifier the proxy accepts fits
MAX_KEY_CHARS = 256

F = TypeVar("F", bound=Callable[..., Any])


def short_key_cache(maxsize: int, max_chars: int = MAX_KEY_CHARS) -> Callable[[F], F]:
    """Decorate a function of one or two positional arguments (strings, or anything
    hashable, which is remembered as it is). The result has the
    ``cache_info()`` and ``cache_clear()`` of its ``lru_cache``; ``key_chars_bound`` is
    the most characters its remembered keys can hold."""

    def wrap(function: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(function)
        arity = function.__code__.co_argcount

        # one closure per arity: the check costs a len() per argument, no loop
        def one(a: Any) -> Any:
            if a.__class__ is str and len(a) > max_chars:
                return function(a)
            return cached(a)

        def two(a: Any, b: Any) -> Any:
            if (a.__class__ is str and len(a) > max_chars) or (
                b.__class__ is str and len(b) > max_chars
            ):
                return function(a, b)
            return cached(a, b)

        if arity not in (1, 2):
            raise TypeError("short_key_cache takes functions of one or two strings")
        call = functools.wraps(function)(one if arity == 1 else two)
        call.cache_info = cached.cache_info  # type: ignore[attr-defined]
        call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        call.key_chars_bound = maxsize * arity * max_chars  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return wrap
