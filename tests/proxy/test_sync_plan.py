"""History sync over every kind of client: the stored log is always the client's history.

A simulated store applies each request's ``SyncPlan`` the way ``Store.append_turn`` does
(supersede after ``keep_through``, append the new messages and the reply). Random
conversations (repeated user texts, tool rounds with parallel calls) are sent by full,
trimming, delta and hybrid clients, with regenerations and edits; after every request the
active log must be exactly the conversation the client holds: never a lost message, never
a duplicate.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from soak import examples
from sync_support import match_page

from proxy.turn.history_sync import Fingerprints, fingerprint
from proxy.turn.sync_plan import detect_mode, earlier_span, needs_earlier, plan_sync
from strategies.records import SessionMeta, SessionSnapshot, StoredMessage

USER_TEXTS = ["yes", "continue", "go on", "why?", "ok"]  # people repeat themselves


@dataclass
class SimulatedStore:
    records: list[StoredMessage] = field(default_factory=list)
    head: int = 0

    @property
    def active(self) -> list[StoredMessage]:
        return [m for m in self.records if not m.meta.get("superseded")]

    def snapshot(self, fingerprints: Fingerprints, mode: str, page_size: int) -> SessionSnapshot:
        active = self.active
        page = active[-page_size:] if page_size else []
        matched, matched_seq = (
            match_page(fingerprints, active) if mode != "delta" else (0, 0)
        )
        meta = SessionMeta(head_seq=self.head, active_count=len(active))
        return SessionSnapshot(meta=meta, messages=page, summaries=[], matched=matched,
                               matched_seq=matched_seq, exists=bool(active))

    def before(self, first_seq: int, count: int) -> list[StoredMessage]:
        """What ``read_before`` reads: active messages in the seq span before the page."""
        low = max(1, first_seq - earlier_span(count))
        return [m for m in self.active if low <= m.seq < first_seq]

    def request(self, conversation: list[dict[str, Any]], reply: dict[str, Any], *,
                header: str | None, page_size: int) -> None:
        fingerprints = Fingerprints(conversation)
        mode = detect_mode(conversation, header=header)
        snapshot = self.snapshot(fingerprints, mode, page_size)
        plan = plan_sync(mode, fingerprints, snapshot)
        if needs_earlier(fingerprints, snapshot, plan):
            first = snapshot.messages[0].seq if snapshot.messages else self.head + 1
            earlier = self.before(first, len(conversation))
            plan = plan_sync(mode, fingerprints, snapshot, page=[*earlier, *snapshot.messages])
        if plan.rewind:
            for record in self.records:
                if plan.keep_through < record.seq <= plan.supersede_until:
                    record.meta["superseded"] = True
        for message in [*(conversation[i] for i in plan.new), reply]:
            self.head += 1
            self.records.append(StoredMessage(
                role=message["role"], content=message.get("content"),
                tool_calls=message.get("tool_calls"), tool_call_id=message.get("tool_call_id"),
                fingerprint=fingerprint(message), seq=self.head, meta={},
            ))


def canonical_log(messages: list[Any]) -> list[str]:
    return [m.fingerprint if isinstance(m, StoredMessage) else fingerprint(m) for m in messages]


@st.composite
def conversations(draw: st.DrawFn) -> tuple[str, str | None, int, list[tuple[str, Any]]]:
    kind = draw(st.sampled_from(["full", "trimming", "delta", "hybrid"]))
    # a client that trims its history does not resend it whole: it never declares "full"
    header = draw(st.sampled_from(
        {"full": [None, "full"], "trimming": [None]}.get(kind, [None, "delta"])
    ))
    page_size = draw(st.integers(min_value=0, max_value=12))
    steps = draw(st.lists(st.tuples(
        st.sampled_from(["say", "say", "say", "regenerate", "edit"]),
        st.integers(min_value=0, max_value=3),   # tool calls in the reply (0: text)
        st.integers(min_value=1, max_value=8),   # how much a trimming client resends
        st.sampled_from([*USER_TEXTS, "new"]),
    ), min_size=1, max_size=25))
    return kind, header, page_size, steps


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_every_kind_of_client_keeps_exactly_its_conversation(case) -> None:
    kind, header, page_size, steps = case
    store = SimulatedStore()
    history: list[dict[str, Any]] = []
    counter = itertools.count(1)

    def reply_for(calls: int) -> dict[str, Any]:
        n = next(counter)
        if not calls:
            return {"role": "assistant", "content": f"reply {n}"}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}_{i}", "type": "function",
             "function": {"name": "lookup", "arguments": f'{{"n": {i}}}'}}
            for i in range(calls)
        ]}

    def sent(base: list[dict[str, Any]], new: list[dict[str, Any]], resend: int,
             turn_start: int) -> list[dict[str, Any]]:
        if kind == "full":
            return [*base, *new]
        if kind == "trimming":
            return [*base[-resend:], *new]
        if kind == "hybrid" and new and new[0]["role"] == "tool":
            return [*base[turn_start:], *new]
        return new

    for action, calls, resend, text in steps:
        user = {"role": "user", "content": text if text != "new" else f"new {next(counter)}"}
        pending = history and history[-1].get("tool_calls")
        if pending:
            base = history
            new = [{"role": "tool", "tool_call_id": call["id"], "content": "ok"}
                   for call in history[-1]["tool_calls"]]
        elif action == "regenerate" and kind in ("full", "trimming") and history:
            base, new = history[:-1], []
        elif action == "edit" and kind in ("full", "trimming") and history:
            users = [i for i, m in enumerate(history) if m["role"] == "user"]
            # a trimming client edits what it still shows: one of its last two questions
            cut = users[-1 - resend % 2] if kind == "trimming" and len(users) > 1 else (
                users[resend % len(users)])
            base, new = history[:cut], [user]
        else:
            base, new = history, [user]
        turn_start = max(
            (i for i, m in enumerate(base) if m["role"] == "user"), default=0
        )
        conversation = sent(base, new, resend, turn_start)
        if not conversation:
            continue
        rewinds = len(base) < len(history)
        if rewinds and header is None and not any(m["role"] == "assistant" for m in conversation):
            # a user-only request that rewinds reads as a delta; such a client says
            # X-Memory-History: full (docs/MEMORY.md)
            continue
        reply = reply_for(calls)
        store.request(conversation, reply, header=header, page_size=page_size)
        history = [*base, *new, reply]
        assert canonical_log(store.active) == canonical_log(history)


def hybrid_steps() -> list[list[dict[str, Any]]]:
    """The requests of an agent loop that sends only the new message between turns and
    the whole current turn during its tool rounds (the OpenAI Agents SDK without a
    session, LangGraph without a checkpointer)."""
    call = {"id": "call_w", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ask = {"role": "user", "content": "call get_weather(city=Paris)"}
    return [
        [{"role": "user", "content": "Remember CODE-X1."}],
        [ask],
        [ask, {"role": "assistant", "content": None, "tool_calls": [call]},
         {"role": "tool", "tool_call_id": "call_w", "content": "sunny"}],
        [{"role": "user", "content": "Which codes?"}],
    ]


@pytest.mark.parametrize("header", [None, "delta"])
def test_a_hybrid_client_continues_its_turn_instead_of_rewinding(header) -> None:
    store = SimulatedStore()
    replies = [
        {"role": "assistant", "content": "Noted."},
        {"role": "assistant", "content": None, "tool_calls": hybrid_steps()[2][1]["tool_calls"]},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "assistant", "content": "CODE-X1."},
    ]
    for request, reply in zip(hybrid_steps(), replies, strict=True):
        store.request(request, reply, header=header, page_size=500)
    assert [m.content for m in store.active] == [
        "Remember CODE-X1.", "Noted.", "call get_weather(city=Paris)", None, "sunny",
        "It is sunny.", "Which codes?", "CODE-X1.",
    ]
    assert not any(m.meta.get("superseded") for m in store.records)
