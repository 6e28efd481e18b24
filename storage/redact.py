"""Credentials out of what is shown: the one place secrets are masked in text.

A store or upstream URL may carry ``user:password@`` (``redis://:secret@host:6379/0``).
Every text that shows a URL (errors answered to clients, log lines, the admin, the CLI's
start-up line) passes through ``mask_url`` first.

An upstream's error may echo the key it was sent (``Incorrect API key provided:
sk-...``): ``mask_secrets`` masks key-like strings (``sk-…``, ``Bearer …``, Google's
``AIza…``) and any of the keys it is given, in every error passed through to a client.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "mask_body", "mask_secrets", "mask_url"]

MASK = "***"
# scheme://userinfo@ : the userinfo runs to the last "@" before the path, query,
# fragment or whitespace (an unencoded "@" in a password is still covered)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#\s]*)@")


def _masked(match: re.Match[str]) -> str:
    user, colon, _password = match[2].partition(":")
    # a user alone may itself be a token (https://TOKEN@host): masked too
    return f"{match[1]}{user}:{MASK}@" if colon else f"{match[1]}{MASK}@"


def mask_url(text: str) -> str:
    """``text`` with the password of every URL in it masked:
    ``redis://:secret@h:6379/0`` -> ``redis://:***@h:6379/0``,
    ``https://user:pw@h/v1`` -> ``https://user:***@h/v1``."""
    return _USERINFO.sub(_masked, text) if "@" in text else text


# known secrets shorter than this are not searched for: masking every "abc" in a body
# would garble it, and a key that short is no secret anyway
MIN_SECRET_CHARS = 8
_KEY_LIKE = re.compile(
    r"\b(?P<prefix>sk-|AIza)[A-Za-z0-9_\-*]{8,}"
    r"|\b(?P<scheme>[Bb]earer|BEARER)\s+[A-Za-z0-9._~+/=\-*]{8,}"
)


def _key_masked(match: re.Match[str]) -> str:
    if match["scheme"]:
        return f"{match['scheme']} {MASK}"
    return f"{match['prefix']}{MASK}"


def mask_secrets(text: str, known: tuple[str, ...] = ()) -> str:
    """``text`` with every string of ``known`` (of at least ``MIN_SECRET_CHARS``), every
    key-like string and every URL password masked."""
    for secret in known:
        if len(secret) >= MIN_SECRET_CHARS and secret in text:
            text = text.replace(secret, MASK)
    return mask_url(_KEY_LIKE.sub(_key_masked, text))


def mask_body(body: bytes, known: tuple[str, ...] = ()) -> bytes:
    """``mask_secrets`` of a response body (JSON stays JSON: the mask has no quote)."""
    if not body:
        return body
    text = body.decode("utf-8", "surrogateescape")
    return mask_secrets(text, known).encode("utf-8", "surrogateescape")
