"""History sync's vocabulary: a request's messages checked, split and fingerprinted.

A message's fingerprint is the sha1 of its canonical form; the chain of position i hashes
the chain before it with the fingerprint, so a resent history is matched against the
stored log from its start in one store round trip (``Store.load(probe=...)``). Where a
request meets the stored log elsewhere,
and what that makes new, is ``proxy/turn/sync_plan.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.errors import BadRequest
from proxy.http.limits import check_message_identifiers
from strategies import native
from strategies.records import StoredMessage, chain_hash

SYSTEM_ROLES = ("system", "developer")
CONVERSATION_ROLES = ("user", "assistant", "tool", "system", "developer")
PLAIN_ROLES = ("user", "assistant", "system", "developer")  # a tuple: a role may be unhashable


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Shape checks the proxy relies on; anything else passes through to the upstream."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    for index, message in enumerate(messages):
        if (
            type(message) is dict
            and type(message.get("content")) is str
            and message.get("role") in PLAIN_ROLES
            and "name" not in message
            and "tool_calls" not in message
            and "tool_call_id" not in message
        ):
            continue  # a plain text message: nothing more to check
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{param} must be an object", param=param)
        role = message.get("role")
        if role not in CONVERSATION_ROLES:
            raise BadRequest(
                f"{param}.role must be one of {', '.join(CONVERSATION_ROLES)}; got {role!r}",
                param=f"{param}.role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequest(
                f"{param}.content must be a string or an array", param=f"{param}.content"
            )
        if isinstance(content, list):
            _check_parts(content, f"{param}.content")
        if "name" in message and not isinstance(message["name"], str):
            raise BadRequest(f"{param}.name must be a string", param=f"{param}.name")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise BadRequest(
                f"{param}.tool_call_id is required for tool messages", param=f"{param}.tool_call_id"
            )
        calls = message.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise BadRequest(
                    f"{param}.tool_calls must be an array on an assistant message",
                    param=f"{param}.tool_calls",
                )
            for call in calls:
                if not isinstance(call, dict) or not isinstance(call.get("id"), str):
                    raise BadRequest(
                        f"{param}.tool_calls entries need an id", param=f"{param}.tool_calls"
                    )
                _check_function(call.get("function"), f"{param}.tool_calls")
        check_message_identifiers(message, param)
    return messages


def _check_parts(parts: list[Any], param: str) -> None:
    for part in parts:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise BadRequest(f"{param} parts must be objects with a string type", param=param)
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise BadRequest(f"{param} text parts need a string text", param=param)


def _check_function(function: Any, param: str) -> None:
    """The fields fingerprints and renderers read: an object of strings (or absent)."""
    if function is None:
        return
    if not isinstance(function, dict) or any(
        key in function and not isinstance(function[key], str) for key in ("name", "arguments")
    ):
        raise BadRequest(
            f"{param}: function must be an object with string name and arguments", param=param
        )


def split_system(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Leading system/developer messages are the system prompt; the rest is conversation."""
    cut = 0
    while cut < len(messages) and messages[cut].get("role") in SYSTEM_ROLES:
        cut += 1
    return messages[:cut], messages[cut:]


def _canonical_content(content: Any) -> Any:
    # native parts (an API's own blocks) are not part of what makes the message the same:
    # a client of another API resends it without them
    content = native.without(content)
    if content is None or content == "":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # a list of text parts is the same message as the joined string
        if all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            return "".join(str(p.get("text", "")) for p in content)
        return [
            {k: v for k, v in sorted(p.items()) if k != "cache_control"}
            if isinstance(p, dict)
            else p
            for p in content
        ]
    return content


def canonical(message: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a message that make it the same message, whatever the client adds."""
    role = message.get("role")
    form: dict[str, Any] = {"r": role, "c": _canonical_content(message.get("content"))}
    calls = message.get("tool_calls")
    if calls:
        form["t"] = [
            [
                c.get("id"),
                (c.get("function") or {}).get("name"),
                (c.get("function") or {}).get("arguments"),
            ]
            for c in calls
        ]
    if role == "tool":
        form["i"] = message.get("tool_call_id")
    return form


def fingerprint(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    role = message.get("role")
    if type(content) is str and content and role != "tool" and not message.get("tool_calls"):
        # the canonical form of a plain text message, its keys already in sorted order
        return hashlib.sha1(orjson.dumps({"c": content, "r": role})).hexdigest()
    return hashlib.sha1(orjson.dumps(canonical(message), option=orjson.OPT_SORT_KEYS)).hexdigest()


class ResentHashes:
    """Fingerprints and chains computed recently, by what they were computed from.

    A full-history client resends the same messages every turn; when its history is longer
    than the page a turn loads, every message is fingerprinted and chained again to match
    it against the store. Both are pure functions of their inputs, so a dictionary lookup
    (the text compared, not hashed again with sha1) answers for the messages seen before.
    Plain text messages only (a role and a string); bounded by ``max_bytes`` of text, past
    which it starts over.
    """

    def __init__(self, max_bytes: int = 8 << 20) -> None:
        self.max_bytes = max_bytes
        self._fingerprints: dict[tuple[str, str], str] = {}
        self._chains: dict[tuple[str, str], str] = {}
        self._size = 0

    def fingerprint(self, message: Mapping[str, Any]) -> str:
        content, role = message.get("content"), message.get("role")
        if (
            type(content) is not str
            or type(role) is not str
            or role == "tool"
            or message.get("tool_calls")
        ):
            return fingerprint(message)
        key = (role, content)
        value = self._fingerprints.get(key)
        if value is None:
            value = self._fingerprints[key] = fingerprint(message)
            self._grew(len(content) + 200)
        return value

    def chains(self, fingerprints: Sequence[str]) -> list[str]:
        """``probe_chains(fingerprints)``."""
        known = self._chains
        out: list[str] = []
        previous = ""
        for fp in fingerprints:
            chain = known.get((previous, fp))
            if chain is None:
                chain = known[(previous, fp)] = chain_hash(previous, fp)
                self._grew(200)
            out.append(chain)
            previous = chain
        return out

    def _grew(self, size: int) -> None:
        self._size += size
        if self._size > self.max_bytes:
            self._fingerprints.clear()
            self._chains.clear()
            self._size = 0


RESENT = ResentHashes()


class Fingerprints:
    """A request's conversation fingerprints, each computed when first asked for; a resent
    message matched against a stored one (``matches``) is compared by its text first. With
    ``resent``, fingerprints and chains come through the process's ``ResentHashes`` (a
    full-history client's messages come again next turn)."""

    __slots__ = ("_fingerprint", "_resent", "_values", "conversation")

    def __init__(
        self, conversation: Sequence[Mapping[str, Any]], resent: ResentHashes | None = None
    ) -> None:
        self.conversation = conversation
        self._values: list[str | None] = [None] * len(conversation)
        self._resent = resent
        self._fingerprint = resent.fingerprint if resent is not None else fingerprint

    def __getitem__(self, index: int) -> str:
        value = self._values[index]
        if value is None:
            value = self._values[index] = self._fingerprint(self.conversation[index])
        return value

    def matches(self, index: int, stored: StoredMessage) -> bool:
        """The request's message at ``index`` is the stored message (same canonical form)."""
        message = self.conversation[index]
        if _same_text(message, stored):
            return True
        content = message.get("content")
        if message.get("role") != stored.role or (
            # two texts that differ are two messages (a tool result is stored as capped,
            # so only its fingerprint tells)
            type(content) is str
            and type(stored.content) is str
            and stored.role != "tool"
            and content != stored.content
        ):
            return False
        return self[index] == stored.fingerprint

    def probe(self) -> list[str]:
        """The chains to match against the stored log (``Store.load(probe=...)``)."""
        fingerprints = [self[i] for i in range(len(self._values))]
        if self._resent is not None:
            return self._resent.chains(fingerprints)
        return probe_chains(fingerprints)


def _same_text(message: Mapping[str, Any], stored: StoredMessage) -> bool:
    """Both are the same plain text message: one role, equal non-empty text, no tool calls.
    Their canonical forms are then equal, so are their fingerprints (text is stored as the
    client sent it; only tool results and media parts are stored altered, and those never
    pass here). False says nothing: the fingerprints decide."""
    content = message.get("content")
    return (
        type(content) is str
        and content != ""
        and content == stored.content
        and message.get("role") == stored.role
        and stored.role != "tool"
        and not stored.tool_calls
        and not message.get("tool_calls")
    )


def probe_chains(fingerprints: Sequence[str]) -> list[str]:
    chains: list[str] = []
    previous = ""
    for fp in fingerprints:
        previous = chain_hash(previous, fp)
        chains.append(previous)
    return chains
