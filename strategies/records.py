"""Pure values shared by strategies, storage and the proxy.

These types are plain values: identity and persistence are the store's concern.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal
from urllib.parse import quote

Role = Literal["user", "assistant", "tool"]
SummaryKind = Literal["summary", "compaction"]
LoadSince = Literal["all", "boundary", "turn"]


def first_version(now: float) -> int:
    """The version a new session starts from (see ``SessionMeta.version``)."""
    return int(now * 1_000_000) * 1000


def chain_hash(previous: str, fingerprint: str) -> str:
    """Hash of a message's position in the active log: sha1(previous chain + fingerprint).

    The first message chains from the empty string. Stores compute the same value
    (Redis with ``redis.sha1hex``), so a client's resent history can be matched
    against the stored log without loading it.
    """
    return hashlib.sha1((previous + fingerprint).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SessionKey:
    """Where a session lives: a client namespace (hash of its API key), an agent, a session id."""

    namespace: str
    agent: str
    session: str

    @property
    def tag(self) -> str:
        """The shared Redis hash tag of every key of this session.

        Parts are percent-escaped: a ``:`` or brace inside an agent or session id can
        neither give two sessions one tag nor end the tag early.
        """
        parts = (quote(part, safe="") for part in (self.namespace, self.agent, self.session))
        return "{" + ":".join(parts) + "}"


@dataclass(slots=True)
class StoredMessage:
    """One message of a session's append-only log.

    ``content`` is always the original (after persist-time tool result caps); a lossless
    compression stub lives in ``compressed_content``. ``tokens`` is counted once, at
    persist time. ``seq`` and ``chain`` are assigned by the store on append.
    """

    role: Role
    content: Any = None
    tokens: int = 0
    fingerprint: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    compressed_content: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    seq: int = 0
    chain: str = ""
    created_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: v for k, v in data.items() if v not in (None, {}, "")} | {
            "role": self.role,
            "seq": self.seq,
            "tokens": self.tokens,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StoredMessage:
        return cls(
            role=data["role"],
            content=data.get("content"),
            tokens=data.get("tokens", 0),
            fingerprint=data.get("fingerprint", ""),
            tool_calls=data.get("tool_calls"),
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
            compressed_content=data.get("compressed_content"),
            meta=data.get("meta") or {},
            seq=data.get("seq", 0),
            chain=data.get("chain", ""),
            created_at=data.get("created_at", 0.0),
        )


def with_stubs(
    messages: Sequence[StoredMessage], stubs: Mapping[int, str | None]
) -> list[StoredMessage]:
    """``messages`` as stored after ``stubs`` (seq -> stub, None or "" clears) were written:
    changed records are copies, the others the same objects."""
    if not stubs:
        return list(messages)
    return [
        replace(m, compressed_content=stubs[m.seq] or None) if m.seq in stubs else m
        for m in messages
    ]


@dataclass(slots=True)
class SummaryRecord:
    """A derived summary of stored messages ``from_seq..to_seq`` (inclusive).

    ``kind="compaction"`` is a boundary: the window restarts after ``to_seq``.
    Summaries never replace the messages they cover; those stay in the log.
    """

    kind: SummaryKind
    text: str
    from_seq: int
    to_seq: int
    tokens: int = 0
    model: str = ""
    id: int = 0
    created_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SummaryRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(slots=True)
class SessionMeta:
    """Per-session bookkeeping kept next to the log and updated by every append.

    ``version`` changes with every write to the session's messages or summaries (append,
    compression stubs, summaries); it starts from the creation time in microseconds x 1000,
    so a session deleted and created again does not reuse the versions of the old one. A
    cache in front of a store serves a session's messages again while it is unchanged
    (``Store.load(held_version=...)``, storage/cached.py).
    """

    head_seq: int = 0
    active_count: int = 0
    head_chain: str = ""
    last_user_seq: int = 0
    boundary_seq: int = 0
    system_prompt: list[dict[str, Any]] | None = None
    system_tokens: int = 0
    calibration: float = 1.0
    model: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionMeta:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What a strategy needs loaded: at most ``limit`` active messages from the tail,
    restricted to those after the latest compaction boundary (``boundary``) or to the
    current turn, starting at the latest user message (``turn``).

    ``fill_ratio``: ``limit`` is a page size, not a bound. The store reads one page as
    always; the proxy then reads older pages (``Store.get_range``) until the messages
    after the latest summary hold ``fill_ratio`` x the context window (calibrated), or the
    log has no more (proxy/turn/paging.py). What a turn loads follows the window's budget, not
    the history."""

    limit: int = 500
    since: LoadSince = "all"
    fill_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class RangeBudget:
    """How much of a range ``Store.get_range`` returns: its newest messages, read from the
    end down, until they hold ``tokens`` (the message that reaches it included). A
    message holds its ``tokens``; one with a compression stub holds what ``stub_size``
    says (its ``tokens`` without one). A paged load asks for the rest of its window's
    budget this way (proxy/turn/paging.py): the store decodes what the window holds, not
    the whole range its estimate had to ask for."""

    tokens: float
    stub_size: Callable[[StoredMessage], int] | None = None

    def size(self, message: StoredMessage) -> int:
        if message.compressed_content is None or self.stub_size is None:
            return message.tokens
        return self.stub_size(message)

    def take(self, newest_first: Iterable[StoredMessage]) -> list[StoredMessage]:
        """What ``get_range`` returns with this budget, from the range's messages newest
        first (a generator that decodes as it goes: none past the budget is made),
        ascending."""
        taken: list[StoredMessage] = []
        if self.tokens > 0:
            held, size = 0, self.size
            for message in newest_first:
                taken.append(message)
                # (most have no stub: no call for them, a cold turn takes a thousand)
                held += message.tokens if message.compressed_content is None else size(message)
                if held >= self.tokens:
                    break
        taken.reverse()
        return taken


@dataclass(slots=True)
class SessionSnapshot:
    """Everything one turn needs, read in one store round trip."""

    meta: SessionMeta
    messages: list[StoredMessage]
    summaries: list[SummaryRecord]
    # number of leading probe chains found in the active log (0 when none matched)
    matched: int = 0
    # seq of the last matched stored message (0 when none matched)
    matched_seq: int = 0
    agent_config: dict[str, Any] | None = None
    exists: bool = False
    # the session's version equals the ``held_version`` the caller passed: messages and
    # summaries were not read (they are empty here; the caller holds them)
    held: bool = False


@dataclass(slots=True)
class TurnWrite:
    """All writes of one turn, applied atomically by ``Store.append_turn``.

    ``supersede_after``: when set, active messages with ``seq > supersede_after`` and
    ``seq <= supersede_until`` are marked superseded (kept, never loaded again) before
    ``messages`` are appended: a client rewound its history.

    ``write_id`` names this write: a store applies one id once (a write whose reply was
    lost is recognised, and the same write sent again is not stored twice). Each write
    gets a fresh one; empty means none.
    """

    messages: list[StoredMessage]
    supersede_after: int | None = None
    supersede_until: int | None = None
    system_prompt: list[dict[str, Any]] | None = None
    system_tokens: int | None = None
    model: str | None = None
    calibration: float | None = None
    # lossless compression stubs decided this turn (seq -> stub), like ``set_compressed``
    compressed: dict[int, str] | None = None
    write_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # a Responses API response id for this write: ``Store.find_response`` finds its seqs
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseRef:
    """Where a stored Responses API response lives in its session's log: the messages of
    the turn write that made it run from ``first_seq`` to ``seq`` (its reply)."""

    response_id: str
    first_seq: int
    seq: int
    created_at: float = 0.0


@dataclass(slots=True)
class AppendResult:
    seqs: list[int]
    superseded: int
    meta: SessionMeta


@dataclass(slots=True)
class LogPage:
    """A page of a session's whole log (``Store.read_log``): every stored message in
    ``seq`` order, superseded ones included (their seqs in ``superseded``). ``next_after``
    is the cursor of the next page, None after the last."""

    messages: list[StoredMessage]
    superseded: set[int] = field(default_factory=set)
    next_after: int | None = None


@dataclass(slots=True)
class SessionInfo:
    namespace: str
    agent: str
    session: str
    message_count: int
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class AgentInfo:
    agent: str
    session_count: int
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
