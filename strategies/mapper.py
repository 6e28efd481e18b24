"""LlmMessageMapper: the one read-side extension point, stored window -> model messages.

The default ``MessageToLlmMessageMapper`` maps user and assistant text, tool calls and
tool results, places summaries, and renders media parts and attachment notices (see
``strategies/media.py``). A replacement is loaded from a dotted path (``Settings.mapper``) and sees
every message.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from strategies import media, native
from strategies.base import Window, WindowItem
from strategies.summary_prompt import render_summary


@dataclass(slots=True)
class MappingContext:
    """What rendering needs besides the window: the target model, the media kinds it reads,
    where the current turn starts (seq), media bytes preloaded by the proxy, and the API
    the messages go to (``api``: native parts of other APIs are removed, see
    ``strategies/native.py``; ``"chat"`` removes them all)."""

    model: str = ""
    capabilities: frozenset[str] = frozenset()
    current_turn_seq: int = 0
    parts: Mapping[str, tuple[bytes, str]] = field(default_factory=dict)
    api: str = "chat"


class LlmMessageMapper(Protocol):
    def map(
        self,
        window: Window,
        system_prompt: list[dict[str, Any]] | None,
        context: MappingContext,
    ) -> list[dict[str, Any]]:
        """The full message list to send: one system block first, then the window.

        The window's messages and ``system_prompt`` are shared with later turns (the
        session cache and the store's prompt cache hold them): read them, never change
        them. The returned list is the caller's, but the messages in it may be shared
        too (a record's rendering is kept on it for the turns after): an upstream that
        changes what it sends copies them first."""


class MessageToLlmMessageMapper:
    """The default mapper."""

    def map(
        self,
        window: Window,
        system_prompt: list[dict[str, Any]] | None,
        context: MappingContext,
    ) -> list[dict[str, Any]]:
        system = [dict(m) for m in system_prompt or ()]
        out: list[dict[str, Any]] = []
        summary = window.summaries[-1] if window.summaries else None
        if summary is not None:
            rendered = render_summary(summary, window.summary_placement)
            if isinstance(rendered, str):
                system = _append_to_system(system, rendered)
            else:
                out.append(rendered)
        cls = type(self)
        if cls.map_item is not _MAP_ITEM or cls.map_content is not _MAP_CONTENT:
            # a subclass reshapes items: every item goes through its methods
            out.extend([self.map_item(item, context) for item in window.items])
            return system + out
        append = out.append
        for item in window.items:
            # inline ``map_item`` for the common case (text content, no media, no system
            # role); anything else takes the general path
            message = item.message
            text = item.text
            content = message.content if text is None else text
            role = message.role
            meta = message.meta
            if (
                (content.__class__ is not str and isinstance(content, list))
                or (text is not None and isinstance(message.content, list))
                or (meta and (meta.get("parts") or meta.get("attachments")))
                or role == "system"
                or role == "developer"
            ):
                content = _plain_parts(item, context.api)
                if content is None:
                    append(self.map_item(item, context))
                    continue
            sent: dict[str, Any]
            if role == "tool":
                append({"role": role, "content": content, "tool_call_id": message.tool_call_id})
                continue
            sent = {"role": role, "content": content}
            if role == "assistant" and message.tool_calls:
                sent["tool_calls"] = message.tool_calls
                if content in ("", None):
                    sent["content"] = None
            if message.name:
                sent["name"] = message.name
            append(sent)
        return system + out

    def map_item(self, item: WindowItem, context: MappingContext) -> dict[str, Any]:
        message = item.message
        content: Any = item.text if item.text is not None else message.content
        if item.text is not None and native.has_native(message.content):
            # a shrunk message keeps its native parts (a thinking block stays with its turn)
            rest = (
                media.truncated_with_media(item.text, message.content)
                if media.keeps_media(item)
                else None
            )
            content = native.with_text(item.text, message.content, rest)
        content = native.for_api(content, context.api)
        if message.role in ("system", "developer"):
            # a mid-conversation instruction: one system block stays first for strict providers
            return {"role": "user", "content": f"[system note]\n{_text(content)}"}
        rendered: dict[str, Any] = {
            "role": message.role,
            "content": self.map_content(item, content, context),
        }
        if message.role == "assistant":
            if message.tool_calls:
                rendered["tool_calls"] = message.tool_calls
                if rendered["content"] in ("", None):
                    rendered["content"] = None
        elif message.role == "tool":
            rendered["tool_call_id"] = message.tool_call_id
        if message.name and message.role != "tool":
            rendered["name"] = message.name
        return rendered

    def map_content(self, item: WindowItem, content: Any, context: MappingContext) -> Any:
        """Content as the model receives it; media parts and the attachment notice are
        rendered by ``strategies.media``."""
        if isinstance(content, list) or media.has_media(item.message):
            return media.render_parts(item, content, context)
        return content


_MAP_ITEM = MessageToLlmMessageMapper.map_item
_MAP_CONTENT = MessageToLlmMessageMapper.map_content


def _plain_parts(item: WindowItem, api: str) -> Any:
    """The content ``map_item`` renders for a message kept whole whose list holds only
    text and native parts (a reply with its reasoning), in one pass; None for anything
    else (media, attachments, a shrunk message, a system note), which takes ``map_item``."""
    message = item.message
    meta = message.meta
    if (
        item.text is not None
        or type(message.content) is not list
        or message.role in ("system", "developer")
        or (meta and (meta.get("parts") or meta.get("attachments")))
    ):
        return None
    return native.plain_for_api(message.content, api)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _append_to_system(system: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if not system:
        return [{"role": "system", "content": text.lstrip()}]
    last = dict(system[-1])
    content = last.get("content")
    if isinstance(content, list):
        last["content"] = [*content, {"type": "text", "text": text}]
    else:
        last["content"] = (content or "") + text
    return [*system[:-1], last]


def load_mapper(path: str) -> LlmMessageMapper:
    """Instantiate a mapper from ``"package.module:Name"`` or ``"package.module.Name"``."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    target = getattr(importlib.import_module(module_name), attr)
    return target() if isinstance(target, type) else target  # type: ignore[no-any-return]
