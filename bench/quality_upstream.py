"""The fake upstream's answers in the memory-quality replay (bench/quality.py): the
conversation's next turn, which the replay scripts, for the agent's calls, and summaries
from an extractive stand-in for the summarizer's (the first sentence of each transcript
item and of the previous summary, newest kept within the call's max_tokens): summary recall
measures what the mechanism lets through, not what a model would write.

Prompt sizes are counted as the proxy counts them (so calibration stays near 1), and each
replayed turn's prompt cache hit is scored with OpenAI's rule: the longest common prefix
with the previous request, counted when at least 1,024 tokens, in steps of 128.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

import _paths  # noqa: F401  (the repository's packages)
import orjson

from proxy.testing.fake_upstream import Reply, default_usage
from strategies.summary_prompt import SUMMARY_SYSTEM_PROMPT
from strategies.tokens import count_message, count_text

# the agents' model: the proxy and the fake count tokens with its tokenizer
MODEL = "gpt-4o"
CACHE_MIN, CACHE_STEP = 1024, 128


def is_summarizer(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or [{}]
    return str(messages[0].get("content", "")).startswith(SUMMARY_SYSTEM_PROMPT)


_ITEM = re.compile(r"^\[(\d+)\] [A-Z ]+(?:\([^)]*\))?: ?(.*)$")


def first_sentence(text: str) -> str:
    text = text.strip().split("\n", 1)[0]
    match = re.search(r"[.!?](\s|$)", text)
    return text[: match.end()].strip() if match else text[:200]


def extractive_summary(body: dict[str, Any]) -> str:
    """The stand-in summarizer: the previous summary's lines, then the first sentence of
    each transcript item, the oldest dropped until the text fits the call's max_tokens."""
    content = str(body["messages"][1]["content"])
    lines: list[str] = []
    previous = re.search(r"## Previous summary \([^)]*\)\n(.*?)\n\n## Transcript", content, re.S)
    if previous:
        lines += [line for line in previous.group(1).splitlines() if line.strip()]
    transcript = content.split("## Transcript", 1)[-1]
    for line in transcript.splitlines():
        match = _ITEM.match(line)
        if match and match[2].strip():
            lines.append(first_sentence(match[2]))
    limit = int(body.get("max_tokens") or 1000)
    while len(lines) > 1 and count_text("\n".join(lines), MODEL) > limit:
        lines = lines[max(1, len(lines) // 10):]
    return "\n".join(lines) or "nothing to remember"


@dataclass
class CacheScore:
    requests: int = 0
    hits: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


class Upstream:
    """The fake upstream's answers: the replay's scripted replies for the agent's calls,
    extractive summaries for the summarizer's; prompt sizes counted as the proxy counts
    them (so calibration stays near 1) and cache hits scored per session."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.sizes: dict[bytes, int] = {}
        self.previous: list[tuple[bytes, int]] = []
        self.cache = CacheScore()
        # the replies report cached tokens (OpenAI's usage shape); off: a provider with no
        # prompt cache (stablePrefix "auto" then keeps none)
        self.reports_cache = True

    def new_session(self) -> None:
        self.previous = []
        self.cache = CacheScore()

    def _sized(self, body: dict[str, Any]) -> list[tuple[bytes, int]]:
        sized = []
        for message in body.get("messages") or []:
            key = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            size = self.sizes.get(key)
            if size is None:
                size = self.sizes[key] = count_message(message, MODEL)
            sized.append((key, size))
        return sized

    def count(self, body: dict[str, Any]) -> int:
        return sum(size for _, size in self._sized(body)) + 3

    def __call__(self, body: dict[str, Any]) -> Reply:
        if is_summarizer(body):
            return Reply.text(extractive_summary(body))
        sized = self._sized(body)
        cached = self._score(sized)
        reply = self.replies.popleft() if self.replies else Reply.text("OK.")
        if not self.reports_cache:
            return reply
        usage = default_usage(reply, sum(size for _, size in sized) + 3)
        # as a provider with a prompt cache reports it
        return dataclasses.replace(reply, usage={
            **usage, "prompt_tokens_details": {"cached_tokens": cached}})

    def _score(self, sized: list[tuple[bytes, int]]) -> int:
        total = sum(size for _, size in sized) + 3
        common = 0
        for (key, size), (before, _) in zip(sized, self.previous, strict=False):
            if key != before:
                # within the first message that differs: its common text prefix
                prefix = os.path.commonprefix([key.decode(), before.decode()])  # noqa: RUF071
                common += count_text(prefix, MODEL) if prefix else 0
                break
            common += size
        cached = 0 if common < CACHE_MIN else common // CACHE_STEP * CACHE_STEP
        if self.previous:
            self.cache.requests += 1
            self.cache.hits += cached > 0
            self.cache.prompt_tokens += total
            self.cache.cached_tokens += min(cached, total)
        self.previous = sized
        return cached
