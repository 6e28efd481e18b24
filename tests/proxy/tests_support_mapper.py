"""A custom LlmMessageMapper for the dotted-path test: upper-cases user text."""

from __future__ import annotations

from typing import Any

from strategies.mapper import MessageToLlmMessageMapper


class ShoutingMapper(MessageToLlmMessageMapper):
    def map(self, window: Any, system_prompt: Any, context: Any) -> list[dict[str, Any]]:
        messages = super().map(window, system_prompt, context)
        return [
            {**m, "content": m["content"].upper()} if m["role"] == "user" else m
            for m in messages
        ]
