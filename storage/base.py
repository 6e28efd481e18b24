"""The Store port: where sessions, their message logs and summaries live.

Every backend passes the contract in ``tests/storage/test_store_*_contract.py``, alone and
behind the session cache (``storage/cached.py``). Each method is one store round trip (one
SQLite transaction on the store's thread, one Redis script or pipeline), whatever the length
of the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from strategies.records import (
    AgentInfo,
    AppendResult,
    LoadSpec,
    LogPage,
    RangeBudget,
    ResponseRef,
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
)


class StoreUnavailable(Exception):
    """The backend cannot be reached (connection refused, timeout)."""


@runtime_checkable
class Store(Protocol):
    async def open(self) -> None:
        """Open connections, create the schema. Must not fail when the backend is down:
        the proxy starts anyway and ``ping`` reports it."""

    async def close(self) -> None:
        """Release connections and threads."""

    async def ping(self) -> bool:
        """True when the backend answers."""

    async def load(
        self,
        key: SessionKey,
        spec: LoadSpec,
        *,
        probe: Sequence[str] = (),
        held_version: int | None = None,
    ) -> SessionSnapshot:
        """Read one turn's worth of a session in one round trip.

        Returns the meta, the active (non-superseded) messages selected by ``spec`` in
        ascending ``seq`` order, every summary record (ascending ``id``), the agent's
        stored config override, and the probe match: ``probe`` is the chain hashes of the
        client's resent messages in order; ``matched`` is the length of the longest prefix
        of ``probe`` whose last chain is an active message's chain, ``matched_seq`` that
        message's seq. A missing session yields an empty snapshot with ``exists=False``.

        ``held_version``, a precondition for a cache in front of the store
        (storage/cached.py): when the session's ``meta.version`` equals it, messages and
        summaries are not read and the snapshot has ``held=True`` and empty lists (meta,
        config and probe match are read as always, in the same round trip). Every write
        to a session's messages or summaries changes its version.
        """

    async def append_turn(self, key: SessionKey, write: TurnWrite) -> AppendResult:
        """Apply one turn atomically: supersede (if asked), append ``write.messages`` at
        the head assigning ``seq`` and ``chain``, update meta and the agent/session
        indexes. Concurrent appends to one session never interleave their messages. The
        result's ``meta.version`` is one past the version before the write (unless the
        write's id was applied before: then nothing is written)."""

    async def set_compressed(self, key: SessionKey, stubs: dict[int, str | None]) -> None:
        """Set (or clear, with None) ``compressed_content`` of messages by seq. Lossless:
        ``content`` is never touched."""

    async def add_summary(
        self, key: SessionKey, summary: SummaryRecord, *, expect_boundary: int | None = None
    ) -> SummaryRecord | None:
        """Append a summary record, assigning its ``id``. A ``compaction`` moves the
        session's ``boundary_seq`` to ``summary.to_seq``. With ``expect_boundary`` set, the
        write only happens when the current boundary equals it (compare-and-set: two
        replicas never both compact one overflow); returns None when it did not."""

    async def get_messages(self, key: SessionKey, seqs: Sequence[int]) -> list[StoredMessage]:
        """Messages by seq (superseded included), in the order asked; unknown seqs skipped."""

    async def get_range(
        self, key: SessionKey, from_seq: int, to_seq: int, *, budget: RangeBudget | None = None
    ) -> list[StoredMessage]:
        """Active messages with ``from_seq <= seq <= to_seq``, ascending. With ``budget``,
        only the newest of them it asks for: from ``to_seq`` down, up to the first message
        at which they hold ``budget.tokens`` (the whole range when they never do); the
        messages below it are not decoded."""

    async def find_tool_result(self, key: SessionKey, tool_call_id: str) -> StoredMessage | None:
        """The newest tool message answering ``tool_call_id``, if any."""

    async def read_log(self, key: SessionKey, *, after: int = 0, limit: int = 100) -> LogPage:
        """At most ``limit`` stored messages with ``seq > after``, ascending, superseded ones
        included (their seqs in ``superseded``): the session's whole record, page by page.
        ``next_after`` is the last seq returned while later messages exist, else None."""

    async def search_messages(
        self,
        key: SessionKey,
        words: Sequence[str],
        *,
        exclude: Sequence[int] = (),
        limit: int = 5,
    ) -> list[StoredMessage]:
        """Active messages of a session whose original content (or tool calls) holds any
        of ``words`` (case-folded words, see ``storage.search.query_words``), best match
        first, at most ``limit``; seqs in ``exclude`` are left out. Bounded: SQLite
        searches its full-text index, Redis the newest ``SEARCH_SCAN`` messages."""

    async def find_response(self, key: SessionKey, response_id: str) -> ResponseRef | None:
        """The response a turn write stored with ``TurnWrite.response_id`` in this session
        (its messages may since have been superseded), None when unknown or forgotten.
        Responses are removed with their session."""

    async def forget_response(self, key: SessionKey, response_id: str) -> bool:
        """Forget a stored response id (its messages stay in the log); True when it was
        known."""

    async def set_calibration(self, key: SessionKey, value: float) -> None:
        """Store the session's token-estimate calibration factor."""

    async def list_agents(self) -> list[AgentInfo]:
        """Agents seen in traffic, newest activity first."""

    async def list_sessions(self, agent: str, *, limit: int = 200) -> list[SessionInfo]:
        """Sessions of one agent across namespaces, newest activity first."""

    async def find_sessions(self, agent: str, session: str) -> list[SessionInfo]:
        """The sessions of ``agent`` named ``session``, one per namespace that has it
        (two API keys may use one id), newest activity first: exact, however many
        sessions the agent has."""

    async def count_sessions(self, namespace: str) -> int:
        """How many sessions one client namespace (API key) has, across agents."""

    async def delete_session(self, key: SessionKey) -> bool:
        """Remove every record of a session and its index entries."""

    async def get_agent_config(self, agent: str) -> dict[str, Any] | None:
        """The admin-saved definition override of an agent, if any."""

    async def set_agent_config(self, agent: str, config: dict[str, Any] | None) -> None:
        """Save (or clear, with None) an agent's definition override."""

    async def acquire_lock(self, key: SessionKey, name: str, ttl: float) -> str | None:
        """Take a named per-session lock shared by every replica; returns a token, or None
        when another holder has it. The lock expires after ``ttl`` seconds."""

    async def release_lock(self, key: SessionKey, name: str, token: str) -> None:
        """Release a lock taken with ``token`` (a stale token releases nothing)."""

    # Media parts belong to the session that stored them: readable only under its key
    # (another key's session, another namespace, reads nothing), removed with it by
    # ``delete_session``.

    async def put_part(self, key: SessionKey, digest: str, data: bytes, media_type: str) -> None:
        """Store media bytes once for the session under their content hash (idempotent)."""

    async def get_part(self, key: SessionKey, digest: str) -> tuple[bytes, str] | None:
        """Bytes and media type of a part the session stored."""

    async def put_parts(self, key: SessionKey, parts: Sequence[tuple[str, bytes, str]]) -> None:
        """Store many ``(digest, bytes, media type)`` parts for the session once each, in
        one round trip."""

    async def get_parts(
        self, key: SessionKey, digests: Sequence[str]
    ) -> dict[str, tuple[bytes, str]]:
        """Bytes and media type of each digest the session stored, in one round trip
        (missing ones are left out)."""
