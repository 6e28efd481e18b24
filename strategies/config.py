"""memoryConfig: a discriminated union on ``kind`` with the spec's names and defaults.

Unknown fields and wrong types are rejected; the error names the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

Placement = Literal["SYSTEM_PROMPT", "USER_MESSAGE"]
Ratio = Annotated[float, Field(gt=0, le=1)]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class SummarizingWindowConfig(_Config):
    kind: Literal["summarizing_window"] = "summarizing_window"
    maxConversationRatio: Ratio = 0.80
    maxMessageRatio: Ratio = 0.20
    compressToolResults: bool = True
    minToolResultCompressTokens: Annotated[int, Field(ge=0)] = 500
    toolResultThresholdRatio: Ratio = 0.02
    compressWhenWindowAboveRatio: Ratio = 0.50
    autoSummarize: bool = False
    autoSummarizeRatio: Ratio = 0.75
    summaryPlacement: Placement = "SYSTEM_PROMPT"
    maxHistoryFetch: Annotated[int, Field(ge=1)] = 500
    # extensions beyond the spec (docs/MEMORY.md, "Keeping the prompt cache warm"): the
    # window start stays where it was until the budget is reached, then the window is
    # trimmed in one step to trimTargetShare of the budget and compression stubs are
    # applied then, in one batch. stablePrefix false: the spec's refit at every request;
    # "auto": stable once the upstream reports prompt caching on the session, else false.
    stablePrefix: bool | Literal["auto"] = "auto"
    trimTargetShare: Ratio = 0.3


class ToolResultEviction(_Config):
    afterTurns: Annotated[int, Field(ge=1)] = 1
    aboveTokens: Annotated[int, Field(ge=0)] = 500


class AutoCompactConfig(_Config):
    kind: Literal["auto_compact"] = "auto_compact"
    compactAtRatio: Ratio = 0.80
    summaryPlacement: Placement = "USER_MESSAGE"
    toolResultEviction: ToolResultEviction | None = None


class WindowedConfig(_Config):
    kind: Literal["windowed"] = "windowed"
    windowSize: Annotated[int, Field(ge=1)] = 20
    # extension (docs/MEMORY.md): the window starts on a seq that is a multiple of
    # windowStep (plus one), so its start moves once every windowStep messages instead of at
    # every message; it then holds windowSize - windowStep + 1 to windowSize messages. 1: the
    # spec's last windowSize messages exactly
    windowStep: Annotated[int, Field(ge=1)] = 1


class FullConfig(_Config):
    kind: Literal["full"] = "full"
    maxHistoryFetch: Annotated[int, Field(ge=1)] = 500


class NoneConfig(_Config):
    kind: Literal["none"] = "none"


MemoryConfig = Annotated[
    SummarizingWindowConfig | AutoCompactConfig | WindowedConfig | FullConfig | NoneConfig,
    Field(discriminator="kind"),
]
KINDS = ("summarizing_window", "auto_compact", "windowed", "full", "none")

_adapter: TypeAdapter[MemoryConfig] = TypeAdapter(MemoryConfig)


class MemoryConfigError(ValueError):
    """A memoryConfig that breaks the schema; ``field`` is the dotted path of the culprit."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def parse_memory_config(data: Any) -> MemoryConfig:
    """Validate a memoryConfig object; None (not configured) means summarizing_window defaults."""
    if data is None:
        return SummarizingWindowConfig()
    if not isinstance(data, dict):
        raise MemoryConfigError("memoryConfig must be a JSON object", field="memoryConfig")
    if "kind" not in data:
        raise MemoryConfigError(
            f"memoryConfig.kind is required: one of {', '.join(KINDS)}", field="memoryConfig.kind"
        )
    if data["kind"] not in KINDS:
        raise MemoryConfigError(
            f"memoryConfig.kind {data['kind']!r} is not one of {', '.join(KINDS)}",
            field="memoryConfig.kind",
        )
    try:
        return _adapter.validate_python(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        # loc is (kind-tag, field, ...) for a discriminated union
        loc = [str(part) for part in error["loc"][1:]] or ["kind"]
        field = "memoryConfig." + ".".join(loc)
        raise MemoryConfigError(f"{field}: {error['msg']}", field=field) from None


def default_config() -> SummarizingWindowConfig:
    return SummarizingWindowConfig()
