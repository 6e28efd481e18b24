"""Hints that keep the provider's prompt cache warm, added to a request on its way out.

- Anthropic (``anthropic/...``, which litellm carries to the provider, or any model id
  naming claude): ``cache_control`` breakpoints at the end of each stable stretch: the
  system prompt (the tools are cached with it), the summary the window opens with
  (``summaryPlacement: USER_MESSAGE``), the message before the first one the proxy changed
  since the previous request (the cache written up to there is read back) and the last
  message; at most four, the provider's limit. A request that carries a ``cache_control``
  of its own is the client's to place: nothing is added. Setting ``cache_breakpoints``:
  ``auto`` (those models), ``all`` (every model: a gateway that forwards them), ``off``.
- OpenAI: ``prompt_cache_key``, a stable hash of the session (namespace, agent, session),
  when the client sent none, so the session's requests reach the same cache.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from strategies.summary_prompt import is_summary_message

EPHEMERAL = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4
# model prefixes whose provider takes cache_control breakpoints
ANTHROPIC_PREFIXES = ("anthropic/",)


def anthropic_breakpoints(
    messages: Sequence[Mapping[str, Any]], changed_at: int | None = None
) -> list[int]:
    """Indices of the messages that end a stable stretch, ascending: the last leading
    system message, the summary message right after it (if any), the message before
    ``changed_at`` (the first message that differs from the previous request's) and the
    last message."""
    marks: list[int] = []
    system_end = 0
    while system_end < len(messages) and messages[system_end].get("role") in (
        "system", "developer"
    ):
        system_end += 1
    if system_end:
        marks.append(system_end - 1)
    if system_end < len(messages) and is_summary_message(messages[system_end]):
        marks.append(system_end)
    if changed_at is not None and 0 < changed_at < len(messages) and changed_at - 1 > max(
        marks, default=-1
    ):
        marks.append(changed_at - 1)
    if messages and len(messages) - 1 not in marks:
        marks.append(len(messages) - 1)
    return marks[:MAX_BREAKPOINTS]


def has_cache_control(body: dict[str, Any]) -> bool:
    """Whether the client placed any ``cache_control`` (messages, their parts, tools)."""
    for item in [*(body.get("messages") or ()), *(body.get("tools") or ())]:
        if not isinstance(item, dict):
            continue
        if "cache_control" in item:
            return True
        content = item.get("content")
        if isinstance(content, list) and any(
            isinstance(p, dict) and "cache_control" in p for p in content
        ):
            return True
    return False


def wants_breakpoints(model: str, mode: str = "auto") -> bool:
    """Whether requests for ``model`` get breakpoints under the ``cache_breakpoints``
    setting."""
    if mode == "all":
        return True
    return mode == "auto" and (model.startswith(ANTHROPIC_PREFIXES) or "claude" in model)


def is_openai_model(model: str) -> bool:
    """A model id the OpenAI-compatible upstream takes as is (no provider prefix), or
    litellm's ``openai/...``."""
    return "/" not in model or model.startswith("openai/")


def add_breakpoints(
    messages: list[dict[str, Any]], changed_at: int | None = None
) -> list[dict[str, Any]]:
    """``messages`` with message-level ``cache_control`` on each breakpoint (litellm moves
    it onto the provider's content block). The marked messages are copies: the rendered
    ones are shared with later turns."""
    out = list(messages)
    for index in anthropic_breakpoints(out, changed_at):
        out[index] = {**out[index], "cache_control": dict(EPHEMERAL)}
    return out


def apply(body: dict[str, Any], mode: str, changed_at: int | None = None) -> None:
    """Add the breakpoints to ``body`` (its ``messages`` replaced by a marked copy) when
    its model wants them and the client placed none."""
    messages = body.get("messages")
    if (
        isinstance(messages, list)
        and messages
        and wants_breakpoints(str(body.get("model") or ""), mode)
        and not has_cache_control(body)
    ):
        body["messages"] = add_breakpoints(messages, changed_at)


def prompt_cache_key(namespace: str, agent: str, session: str) -> str:
    """The session's cache key: stable across turns, replicas and restarts, and reveals
    nothing of the namespace (a hash of the client's key) or the ids."""
    raw = "\x1f".join((namespace, agent, session)).encode()
    return "mp-" + hashlib.sha256(raw).hexdigest()[:32]


def for_session(
    body: dict[str, Any], key: Any, settings: Any, changed_at: int | None = None
) -> None:
    """Both hints on a request of session ``key`` (a ``SessionKey``) under ``settings``:
    the session's ``prompt_cache_key`` for an OpenAI model, breakpoints for Anthropic's
    (``changed_at``: see ``anthropic_breakpoints``)."""
    if (
        settings.prompt_cache_key
        and "prompt_cache_key" not in body
        and is_openai_model(str(body.get("model") or ""))
    ):
        body["prompt_cache_key"] = prompt_cache_key(key.namespace, key.agent, key.session)
    apply(body, settings.cache_breakpoints, changed_at)
