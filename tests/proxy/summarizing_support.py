"""Helpers of the summarizing_window end-to-end tests: a scripted upstream that tells the
summarizer's calls apart from the agent's, sized texts, and a delta client that records
what each turn got back."""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from e2e import ADMIN_TOKEN

from proxy.testing.fake_upstream import FakeUpstream, RecordedRequest, Reply, default_usage
from strategies.summary_prompt import is_summarizer_request
from strategies.tokens import count_message, count_text

MODEL = "gpt-4o"
# "T7x4: ..." asks the scripted model for four parallel tool calls in turn 7
_TOOL_TURN = re.compile(r"^T(\d+)x(\d+):")


def sized(tag: str, tokens: int) -> str:
    """A text of exactly ``tokens`` tokens (for MODEL's tokenizer) that starts with ``tag``."""
    head = f"{tag}:"
    text = head + " lorem" * max(0, tokens - count_text(head, MODEL))
    assert count_text(text, MODEL) == tokens, (tag, tokens)
    return text


def is_summarizer_call(body: dict[str, Any]) -> bool:
    return is_summarizer_request(body)


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """What a model with MODEL's tokenizer reports as usage.prompt_tokens for ``messages``
    (3 more tokens prime the reply)."""
    return sum(count_message(m, MODEL) for m in messages) + 3


@dataclass
class ScriptedModel:
    """The fake's default reply: tool calls for ``T<k>x<n>:`` user turns, a short answer
    otherwise, and summaries (from ``summaries``, else a numbered one) for summarizer calls.
    Deciding by the request, not by a queue, keeps background summarizer calls from taking
    a reply meant for a turn."""

    summaries: deque[Reply] = field(default_factory=deque)
    summary_texts: list[str] = field(default_factory=list)
    # a provider with a prompt cache: each agent reply reports as cached the messages its
    # request shares, from the start, with the request before (OpenAI's usage shape)
    caching: bool = False
    _previous: list[bytes] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> Reply:
        reply = self._answer(body)
        if not self.caching or is_summarizer_call(body):
            return reply
        messages = body["messages"]
        sent = [repr(sorted(m.items())).encode() for m in messages]
        with self._lock:
            shared = 0
            for old, new in zip(self._previous, sent, strict=False):
                if old != new:
                    break
                shared += 1
            self._previous = sent
        cached = sum(count_message(m, MODEL) for m in messages[:shared])
        return dataclasses.replace(reply, usage={
            **default_usage(reply, prompt_tokens(messages)),
            "prompt_tokens_details": {"cached_tokens": cached}})

    def _answer(self, body: dict[str, Any]) -> Reply:
        if is_summarizer_call(body):
            with self._lock:
                if self.summaries:
                    return self.summaries.popleft()
                text = (
                    f"SUMMARY-{len(self.summary_texts) + 1}: the user works through numbered "
                    "tasks; order 4711 is confirmed."
                )
                self.summary_texts.append(text)
            return Reply.text(text)
        last = body["messages"][-1]
        if last["role"] == "user":
            match = _TOOL_TURN.match(str(last.get("content") or ""))
            if match:
                turn, count = int(match[1]), int(match[2])
                return Reply.tool_calls([
                    {"id": f"c{turn}_{j}", "name": "lookup", "arguments": {"turn": turn, "j": j}}
                    for j in range(count)
                ])
            return Reply.text(f"noted ({str(last.get('content'))[:12]})")
        return Reply.text(f"read {last.get('tool_call_id')}")


def scripted(fake: FakeUpstream, *, caching: bool = False) -> ScriptedModel:
    """Answer from a ScriptedModel and report usage as MODEL's tokenizer counts it (with
    cached tokens, as a provider with a prompt cache would, when ``caching``)."""
    model = ScriptedModel(caching=caching)
    fake.default_reply = model
    fake.count_tokens = lambda body: prompt_tokens(body.get("messages") or [])
    return model


def agent_requests(fake: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in fake.chat_requests if not is_summarizer_call(r.body)]


def summarizer_requests(fake: FakeUpstream) -> list[RecordedRequest]:
    return [r for r in fake.chat_requests if is_summarizer_call(r.body)]


@dataclass
class Sent:
    """One client request: what the upstream received for it, the proxy's headers, the
    reply (a ChatCompletion; None when streamed) and its text."""

    messages: list[dict[str, Any]]
    headers: dict[str, str]
    reply: Any
    text: str | None


class DeltaSession:
    """A delta client (sends only the new turn) that records every request's outcome."""

    def __init__(self, client: openai.OpenAI, fake: FakeUpstream, system: str | None = None,
                 *, stream: bool = False):
        self.client = client
        self.fake = fake
        self.system = system
        self.stream = stream
        self.sent: list[Sent] = []
        self.results: dict[str, str] = {}  # tool_call_id -> the full result text

    def send(self, messages: list[dict[str, Any]]) -> Sent:
        if self.system is not None:
            messages = [{"role": "system", "content": self.system}, *messages]
        before = len(agent_requests(self.fake))
        raw = self.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, stream=self.stream
        )
        if self.stream:
            chunks = list(raw.parse())  # read to the end: the stream is complete
            reply = None
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = raw.parse()
            text = reply.choices[0].message.content
        requests = agent_requests(self.fake)
        assert len(requests) == before + 1
        sent = Sent(requests[-1].body["messages"], dict(raw.headers), reply, text)
        self.sent.append(sent)
        return sent

    def say(self, text: str) -> Sent:
        return self.send([{"role": "user", "content": text}])

    def tool_turn(self, turn: int, results: list[str]) -> tuple[Sent, Sent]:
        """A user turn whose reply asks for ``len(results)`` tools; the client answers
        them all in one request, and the model answers that."""
        asked = self.say(f"T{turn}x{len(results)}: look it up")
        calls = asked.reply.choices[0].message.tool_calls
        assert [c.id for c in calls] == [f"c{turn}_{j}" for j in range(len(results))]
        answers = [
            {"role": "tool", "tool_call_id": call.id, "content": text}
            for call, text in zip(calls, results, strict=True)
        ]
        self.results.update({call.id: text for call, text in zip(calls, results, strict=True)})
        return asked, self.send(answers)


def tool_contents(messages: list[dict[str, Any]]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def read_results(messages: list[dict[str, Any]]) -> set[str]:
    """Tool results an assistant message follows in ``messages`` (the model has read them)."""
    last_assistant = max(
        (i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1
    )
    return {
        m["tool_call_id"] for m in messages[:last_assistant] if m["role"] == "tool"
    }


def modified(headers: dict[str, str]) -> bool:
    value = headers["x-memory-context-modified"]
    assert value in ("true", "false")
    return value == "true"


def memory_view(proxy: Any, agent: str, session: str) -> dict[str, Any]:
    """``GET /memory/{agent}/{session}``: the working memory as the model receives it."""
    response = httpx.get(f"{proxy.base}/memory/{agent}/{session}",
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200
    return response.json()
