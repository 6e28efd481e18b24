"""Tool-result compression and eviction: which results shrink, and the stubs they become.

Two mechanisms share this module:

- compression (summarizing_window): lossless at the store. The original stays in
  ``content``; the stub is persisted to ``compressed_content`` and rendered from then on.
  A result is compressed only when all four rules of the spec hold (``choose_compressions``).
- eviction (auto_compact's ``toolResultEviction``): render time only, nothing is written.
  The stub points at the built-in ``fetch_tool_result`` tool (``choose_evictions``).

Every comparison against the context window uses calibrated tokens (``tokens *
calibration``): stored counts are local estimates, the limits are the upstream's real ones.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

from strategies.base import CountTokens, WindowItem, rough_tokens
from strategies.config import SummarizingWindowConfig, ToolResultEviction
from strategies.native import NATIVE
from strategies.records import StoredMessage
from strategies.tokens import TOKENS_PER_MESSAGE, TOKENS_PER_NAME

PREVIEW_CHARS = 300
NEWEST_PROTECTED = 3
STUB_HINT = "call the tool again if you need the full output"
FETCH_TOOL = "fetch_tool_result"


def exceeds(tokens: float, ratio: float, context_window: int, calibration: float = 1.0) -> bool:
    """True when ``tokens`` (an estimate, scaled by ``calibration``) is strictly above
    ``ratio * context_window``. Exactly at the ratio does not trigger."""
    # round away float noise: 0.8 * 8192 is 6553.6000000000004 in binary floating point
    return tokens * calibration > round(ratio * context_window, 6)


def content_text(content: Any) -> str:
    """The text of an OpenAI ``content`` value; media parts become a bracketed placeholder,
    native parts are left out."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else [content]
    lines: list[str] = []
    for part in parts:
        if isinstance(part, str):
            lines.append(part)
        elif isinstance(part, dict):
            kind = part.get("type")
            if kind == "text" or (kind is None and isinstance(part.get("text"), str)):
                lines.append(str(part.get("text") or ""))
            elif kind == "refusal":
                lines.append(str(part.get("refusal") or ""))
            elif kind == NATIVE:
                # an API's own block (strategies/native.py): never text of a stub or summary
                continue
            else:
                lines.append(f"[{kind or 'part'}]")
    return "\n".join(lines)


def head_within(text: str, max_tokens: int, count_tokens: CountTokens) -> str:
    """The longest prefix of ``text`` that ``count_tokens`` puts at ``max_tokens`` or less.

    A counter that cuts by tokens itself (``head``, as ``strategies.tokens.Counter``)
    tokenizes the text's head once; any other is asked in a binary search over characters
    (the strategy's tokenizer carries no model name).
    """
    if max_tokens <= 0 or not text:
        return ""
    head = getattr(count_tokens, "head", None)
    if head is not None:
        return str(head(text, max_tokens))
    if count_tokens(text) <= max_tokens:
        return text
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if count_tokens(text[:middle]) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def compression_threshold(config: SummarizingWindowConfig, context_window: int) -> float:
    """The per-result size threshold: max(minToolResultCompressTokens, window * ratio)."""
    return max(
        float(config.minToolResultCompressTokens),
        round(context_window * config.toolResultThresholdRatio, 6),
    )


def framing_tokens(message: StoredMessage, count_tokens: CountTokens) -> int:
    """What a message costs besides its content and tool calls, in the chat format's
    accounting (strategies/tokens.py): the per-message overhead, its role and name."""
    tokens = TOKENS_PER_MESSAGE + count_tokens(message.role)
    if message.name:
        tokens += count_tokens(message.name) + TOKENS_PER_NAME
    return tokens


def result_tokens(message: StoredMessage, count_tokens: CountTokens) -> int:
    """A tool result's own size: the stored message's tokens less its framing. The size
    rules (minToolResultCompressTokens, eviction's aboveTokens) compare this, as the spec
    says "a result above N tokens", not the message around it."""
    return max(0, message.tokens - framing_tokens(message, count_tokens))


def compression_stub(text: str, tokens: int) -> str:
    """A preview of the result plus the way back: the spec's hint, verbatim."""
    preview = text[:PREVIEW_CHARS].rstrip()
    return (
        f"{preview}… [{tokens} tokens compressed by memory-proxy; {STUB_HINT}]"
        if preview
        else f"[{tokens} tokens compressed by memory-proxy; {STUB_HINT}]"
    )


def choose_compressions(
    messages: Sequence[StoredMessage],
    config: SummarizingWindowConfig,
    context_window: int,
    *,
    under_pressure: bool,
    calibration: float = 1.0,
    eligible: Container[int] | None = None,
    count_tokens: CountTokens = rough_tokens,
) -> dict[int, str]:
    """New compression stubs ``{seq: stub}`` for the loaded conversation ``messages``.

    A tool result is compressed only when all hold: (1) an assistant message follows it
    (the model has read it); (2) it is not among the newest three tool results of
    ``messages``, whatever turn they belong to; (3) ``under_pressure`` (the caller measured
    the live window against compressWhenWindowAboveRatio); (4) its own calibrated tokens
    (``result_tokens``) are strictly above ``compression_threshold``. Results that already carry
    ``compressed_content`` are never decided again. ``eligible`` restricts the candidates
    to those seqs (e.g. the unsummarized ones) without changing how the newest three count.
    """
    if not config.compressToolResults or not under_pressure:
        return {}
    roles = [m.role for m in messages]
    if "tool" not in roles:
        return {}
    results = [i for i, role in enumerate(roles) if role == "tool"]
    protected = set(results[-NEWEST_PROTECTED:])
    last_assistant = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), -1
    )
    threshold = compression_threshold(config, context_window)
    stubs: dict[int, str] = {}
    for index in results:
        message = messages[index]
        if (
            message.compressed_content is None
            and index < last_assistant
            and index not in protected
            and result_tokens(message, count_tokens) * calibration > threshold
            and (eligible is None or message.seq in eligible)
        ):
            stubs[message.seq] = compression_stub(content_text(message.content), message.tokens)
    return stubs


def eviction_stub(tool_call_id: str | None, tokens: int) -> str:
    """The render-time pointer that replaces an evicted tool result."""
    return (
        f"[tool result evicted by memory-proxy ({tokens} tokens). Call {FETCH_TOOL} with "
        f'tool_call_id="{tool_call_id or ""}" to reload it.]'
    )


def eviction_start(messages: Sequence[StoredMessage], current_turn_start: int, turns: int) -> int:
    """Index before which tool results are older than ``turns`` user turns.

    ``turns=1`` is the current turn's start (everything before the current user turn is a
    candidate); ``turns=2`` the previous user turn's start, and so on. 0 when the loaded
    messages hold fewer user turns (what came before them is not known to be that old).
    """
    current = min(max(current_turn_start, 0), len(messages))
    starts = [i for i, m in enumerate(messages[: current + 1]) if m.role == "user"]
    if current < len(messages) and current not in starts:
        starts.append(current)
    return starts[-turns] if len(starts) >= turns else 0


def choose_evictions(
    messages: Sequence[StoredMessage],
    eviction: ToolResultEviction,
    current_turn_start: int,
    *,
    calibration: float = 1.0,
    count_tokens: CountTokens = rough_tokens,
) -> set[int]:
    """Indices of tool results to evict: before ``eviction_start`` and at least
    ``aboveTokens`` (calibrated, the result's own size) in size. No newest-three
    protection, by the spec."""
    before = eviction_start(messages, current_turn_start, eviction.afterTurns)
    return {
        i
        for i, m in enumerate(messages[:before])
        if m.role == "tool"
        and result_tokens(m, count_tokens) * calibration >= eviction.aboveTokens
    }


def stub_tokens(message: StoredMessage, stub: str, count_tokens: CountTokens) -> int:
    """The size of ``message`` sent with ``stub`` as its content, in the chat format's
    accounting (strategies/tokens.py): the per-message overhead, role, name and stub."""
    return framing_tokens(message, count_tokens) + count_tokens(stub)


def compressed_item(message: StoredMessage, stub: str, count_tokens: CountTokens) -> WindowItem:
    """``message`` as it goes into the window: its stub in place of its content."""
    return WindowItem(
        message=message,
        tokens=stub_tokens(message, stub, count_tokens),
        text=stub,
        marker="compressed",
    )


def render_stored(message: StoredMessage, count_tokens: CountTokens) -> WindowItem:
    """A stored message as sent: from its persisted stub when it has one, else verbatim."""
    if message.compressed_content is not None:
        return compressed_item(message, message.compressed_content, count_tokens)
    return WindowItem(message=message, tokens=message.tokens)
