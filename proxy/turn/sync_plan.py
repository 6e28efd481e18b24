"""History sync's decision: where a request's conversation meets the stored log, and
what of it is new.

Clients come in three kinds (docs/MEMORY.md, "History sync"): full-history clients resend
the whole conversation, delta clients send only the new messages, and hybrid clients (most
agent loops) send only the new message between turns but resend the current turn during
its tool rounds; a full-history client may also trim its own history. One rule serves all:

- A request whose opening messages equal the stored tail continues it (the current turn
  so far, or the last K messages of a trimming client): nothing is superseded, nothing is
  stored twice, and the memory the client does not resend is kept.
- A request that resends from an earlier point and then diverges (regenerate, edit) is a
  rewind: the stored messages after the point it resends up to are superseded.
- A request that resends nothing stored is new messages, appended; only a client that
  declares itself full-history (``X-Memory-History: full``, ``historyMode: full``, a
  fingerprint-keyed session) says with it that nothing stored is its history any more.

When the request's resent run is as long read as a continuation of the tail as read from
an earlier point, it continues (keeping memory is the safer reading).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.errors import BadRequest
from proxy.turn.history_sync import Fingerprints, fingerprint
from strategies.records import SessionSnapshot, StoredMessage

# "full": the client declares it resends its whole history; "resent": auto-detected, the
# request resends some of it (it holds an assistant message); "delta": only new messages
SyncMode = Literal["full", "resent", "delta"]
MAX_IDEMPOTENCY_KEY = 255


def detect_mode(
    conversation: Sequence[Mapping[str, Any]],
    *,
    agent_mode: str = "auto",
    header: str | None = None,
    fingerprinted: bool = False,
) -> SyncMode:
    """Per-request header, then the agent's historyMode, then auto-detection: a request
    holding an assistant message resends history. A session keyed by fingerprint only
    exists for clients that resend everything, so it is always full."""
    for choice in (header, agent_mode):
        if choice in ("full", "delta"):
            return choice  # type: ignore[return-value]
    if fingerprinted:
        return "full"
    return "resent" if any(m.get("role") == "assistant" for m in conversation) else "delta"


@dataclass(slots=True)
class SyncPlan:
    """``new`` are the indexes (into the request's conversation) of messages to store;
    ``keep_through`` is the seq of the last stored message that stays in the conversation
    (messages after it, up to ``supersede_until``, are superseded when ``rewind``)."""

    mode: SyncMode
    new: list[int] = field(default_factory=list)
    rewind: bool = False
    keep_through: int = 0
    supersede_until: int = 0
    # the request's Idempotency-Key, kept on the stored reply to recognize a replay
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class RetryHint:
    """What a request says about being a retry: the openai SDKs' ``x-stainless-retry-count``
    (above 0 on a retry) and an ``Idempotency-Key`` (the same on every attempt)."""

    attempt: int = 0
    key: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RetryHint:
        count = headers.get("x-stainless-retry-count", "")
        key = headers.get("idempotency-key") or None
        return cls(
            attempt=int(count) if count.isdigit() and len(count) < 6 else 0,
            key=key if key is not None and len(key) <= MAX_IDEMPOTENCY_KEY else None,
        )


def replayed_turn(
    conversation: Sequence[Mapping[str, Any]], snapshot: SessionSnapshot, retry: RetryHint
) -> int | None:
    """A delta that repeats the session's latest turn write, sent again as a retry, is that
    turn regenerated: returns the seq of the stored copy of its last message.

    A retry is an ``Idempotency-Key`` equal to the one kept on the stored reply or, with no
    key, a retry count above 0. The stored tail must be exactly these messages and one reply:
    a retry that lands after another writer's turn is not recognized.
    """
    if not conversation or not (retry.key or retry.attempt > 0):
        return None
    count = len(conversation)
    stored = snapshot.messages
    if len(stored) < count + 1:
        return None
    reply, tail = stored[-1], stored[-count - 1 : -1]
    if reply.role != "assistant" or reply.seq != snapshot.meta.head_seq:
        return None
    if tail[0].seq + count != reply.seq:  # one write: consecutive seqs
        return None
    if retry.key is not None and reply.meta.get("idempotency_key") != retry.key:
        return None
    if [m.fingerprint for m in tail] != [fingerprint(m) for m in conversation]:
        return None
    return tail[-1].seq


def tail_overlap(fingerprints: Fingerprints, page: Sequence[StoredMessage]) -> int:
    """The largest k such that the request's first k messages are the page's last k."""
    size = len(page)
    if not size:
        return 0
    last = page[-1]
    for k in range(min(len(fingerprints.conversation), size), 0, -1):
        if fingerprints.matches(k - 1, last) and all(
            fingerprints.matches(i, page[size - k + i]) for i in range(k - 1)
        ):
            return k
    return 0


def resent_run(fingerprints: Fingerprints, page: Sequence[StoredMessage]) -> tuple[int, int]:
    """Where the request's opening messages appear in the page: ``(index, length)`` of the
    longest run of them found there (the latest such run on a tie), ``(0, 0)`` if none."""
    count = len(fingerprints.conversation)
    best = (0, 0)
    if not count:
        return best
    for index, stored in enumerate(page):
        if not fingerprints.matches(0, stored):
            continue
        length = 1
        while (
            length < count
            and index + length < len(page)
            and fingerprints.matches(length, page[index + length])
        ):
            length += 1
        if length >= best[1]:
            best = (index, length)
    return best


def plan_sync(
    mode: SyncMode,
    fingerprints: Fingerprints,
    snapshot: SessionSnapshot,
    retry: RetryHint | None = None,
    page: Sequence[StoredMessage] | None = None,
) -> SyncPlan:
    """The sync of one request. ``snapshot.matched`` is the store's match from the log's
    start; ``page`` is the newest active messages in order (the snapshot's page unless the
    caller read further back)."""
    conversation = fingerprints.conversation
    meta = snapshot.meta
    key = retry.key if retry is not None else None
    page = snapshot.messages if page is None else page
    everything = list(range(len(conversation)))

    def continuing(resent: int) -> SyncPlan:
        return SyncPlan(mode, new=everything[resent:], keep_through=meta.head_seq,
                        idempotency_key=key)

    def rewinding(resent: int, keep_through: int) -> SyncPlan:
        return SyncPlan(mode, new=everything[resent:], rewind=True, keep_through=keep_through,
                        supersede_until=meta.head_seq, idempotency_key=key)

    if not meta.active_count:
        return continuing(0)
    if mode == "delta":
        replayed = replayed_turn(conversation, snapshot, retry) if retry is not None else None
        if replayed is not None:
            # regenerate: the stored input stays, the earlier reply is superseded
            return rewinding(len(conversation), replayed)
        return continuing(tail_overlap(fingerprints, page))
    if snapshot.matched >= meta.active_count:
        return continuing(snapshot.matched)  # the whole stored log resent, from its start
    tail = tail_overlap(fingerprints, page)
    # a client that resends its whole history resends it from the start: a run found in
    # the middle is a trimming client's
    index, run = resent_run(fingerprints, page) if mode != "full" else (0, 0)
    if tail and tail >= max(run, snapshot.matched):
        return continuing(tail)
    if snapshot.matched and snapshot.matched >= run:
        return rewinding(snapshot.matched, snapshot.matched_seq)
    if run:
        return rewinding(run, page[index + run - 1].seq)
    if mode == "full":
        # the client's whole history is this request: nothing stored is part of it
        return rewinding(0, 0)
    return continuing(0)


def branch(plan: SyncPlan, keep_through: int, head_seq: int, count: int) -> SyncPlan:
    """``plan`` made to continue from the stored message ``keep_through`` rather than the
    head: the request's ``count`` messages are all new and the messages after it are
    superseded (a Responses API ``previous_response_id`` naming an earlier response forks
    the conversation there)."""
    return SyncPlan(plan.mode, new=list(range(count)), rewind=True, keep_through=keep_through,
                    supersede_until=head_seq, idempotency_key=plan.idempotency_key)


def earlier_span(count: int) -> int:
    """How many seqs before the page are read for a request of ``count`` messages: its
    own length (a tail overlap) and room for a rewind a few turns back."""
    return 4 * count + 64


def needs_earlier(
    fingerprints: Fingerprints, snapshot: SessionSnapshot, plan: SyncPlan
) -> bool:
    """The loaded page may be too short to see where a request that resends history meets
    the stored log: the caller reads the messages before it and plans again. Only a tail
    continuation the page could hold whole is settled by the page (the common cases: a
    hybrid client's tool round, a trimming client's last messages); a rewind, a request
    that meets nothing on the page, or one longer than the page is read further back."""
    conversation = fingerprints.conversation
    page = snapshot.messages
    active = snapshot.meta.active_count
    if plan.rewind and plan.mode == "delta":  # a retry's replay, found on the page
        return False
    if snapshot.matched >= active or len(page) >= active:
        return False
    if plan.mode != "full" and not any(m.get("role") == "assistant" for m in conversation):
        return False  # a user-only request resends nothing, unless declared full-history
    continued = not plan.rewind and len(plan.new) < len(conversation)
    return not continued or len(conversation) > len(page)


def check_tool_results(
    conversation: Sequence[Mapping[str, Any]], new: Sequence[int], known_call_ids: set[str]
) -> None:
    """A new tool result must answer a call the conversation holds (else providers 400)."""
    ids = set(known_call_ids)
    for index, message in enumerate(conversation):
        for call in message.get("tool_calls") or ():
            ids.add(call["id"])
        if (
            index in new
            and message.get("role") == "tool"
            and message.get("tool_call_id") not in ids
        ):
            raise BadRequest(
                f"messages: tool result for unknown tool_call_id {message.get('tool_call_id')!r}",
                param="messages",
                code="orphan_tool_result",
            )
