"""Replacements loaded by dotted path in the media tests: a part reader that records what
it was asked for, and a mapper that records every message it maps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from storage.parts import StorePartReader
from strategies.mapper import MessageToLlmMessageMapper
from strategies.records import SessionKey


class RecordingPartReader(StorePartReader):
    asked: ClassVar[list[list[str]]] = []

    async def read_parts(
        self, key: SessionKey, digests: Sequence[str]
    ) -> dict[str, tuple[bytes, str]]:
        RecordingPartReader.asked.append(list(digests))
        return await super().read_parts(key, digests)


class RecordingMapper(MessageToLlmMessageMapper):
    seen: ClassVar[list[tuple[str, Any]]] = []

    def map(self, window: Any, system_prompt: Any, context: Any) -> list[dict[str, Any]]:
        RecordingMapper.seen.extend((i.message.role, i.message.content) for i in window.items)
        return super().map(window, system_prompt, context)
