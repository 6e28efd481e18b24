"""Credentials out of what is shown: the one place a URL's password is masked.

A store or upstream URL may carry ``user:password@`` (``redis://:secret@host:6379/0``).
Every text that shows a URL (errors answered to clients, log lines, the admin, the CLI's
start-up line) passes through ``mask_url`` first.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "mask_url"]

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
