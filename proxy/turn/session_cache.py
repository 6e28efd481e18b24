"""Sessions this process served recently, kept decoded between turns.

A turn's load passes the cached version (``Store.load(known_version=...)``); while nobody
else wrote to the session the store answers with the head only and the turn reuses the
messages it holds, so a turn costs the same whatever the stored history. The proxy's own
turn writes are applied to the cached copy when the store reports that no other write came
in between (the version moved by exactly one). When other writes only appended (turns
another worker or replica served), the load passes the cached head too and reads only the
messages after it (``known_head``): the cached copy catches up. Anything else (a rewind,
compression stubs, a summary or compaction, an admin edit) and the next load reads the
session again. Cached messages are shared between turns and never mutated:
a change is a new record (``dataclasses.replace``).

Bounded by an estimate of the memory it holds (``MEMORY_PROXY_SESSION_CACHE_MB``; a
message is counted as ``MESSAGE_OVERHEAD`` bytes plus 4 per token, measured against
tracemalloc on typical messages, plus its ids and name, which tokens do not count; each
session also counts its key strings), least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strategies.records import (
    LoadSpec,
    SessionKey,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    chain_hash,
    with_stubs,
)

__all__ = ["CachedSession", "SessionCache", "estimated_bytes", "key_bytes"]

# the record, its fingerprint and chain strings, its meta dict and the list slot
MESSAGE_OVERHEAD = 600
BYTES_PER_TOKEN = 4


# an entry's slot: the tuple, its dict slot and the OrderedDict's link, besides its strings
SLOT_OVERHEAD = 200


def _id_chars(message: StoredMessage) -> int:
    """The characters of a message's ids and name, which its tokens do not count."""
    size = len(message.tool_call_id or "") + len(message.name or "")
    for call in message.tool_calls or ():
        if isinstance(call, dict):
            size += len(str(call.get("id") or ""))
    return size


def estimated_bytes(messages: Sequence[StoredMessage]) -> int:
    size = MESSAGE_OVERHEAD * len(messages) + BYTES_PER_TOKEN * sum(m.tokens for m in messages)
    return size + sum(
        _id_chars(m) for m in messages if m.tool_call_id or m.tool_calls or m.name
    )


def slot_bytes(slot: Slot) -> int:
    """What a cached session's slot holds besides the entry: its key strings."""
    return SLOT_OVERHEAD + len(slot[0]) + len(slot[1]) + len(slot[2]) + len(slot[4])


def key_bytes(key: SessionKey, spec: LoadSpec) -> int:
    """The estimate a session cached under ``key`` and ``spec`` adds for its key."""
    return slot_bytes(_slot(key, spec))


def _within(
    spec: LoadSpec, messages: tuple[StoredMessage, ...], size: int
) -> tuple[tuple[StoredMessage, ...], int]:
    """A page and its estimated size, cut to the newest ``spec.limit`` messages. A paged
    spec's (``fill_ratio``) limit is its page size: its page is kept as loaded, grown by
    the appends since, and the next load trims it to the window's budget."""
    if len(messages) <= spec.limit or spec.fill_ratio is not None:
        return messages, size
    cut = len(messages) - spec.limit if spec.limit > 0 else len(messages)
    return messages[cut:], size - estimated_bytes(messages[:cut])


# a plain tuple: hashing and comparing it is cheaper than the frozen dataclasses
Slot = tuple[str, str, str, int, str, float | None]


def _slot(key: SessionKey, spec: LoadSpec) -> Slot:
    return (key.namespace, key.agent, key.session, spec.limit, spec.since, spec.fill_ratio)


@dataclass(frozen=True, slots=True)
class CachedSession:
    """What ``Store.load(key, spec)`` returned at ``version``, when the session's head was
    ``head_seq``."""

    version: int
    head_seq: int
    messages: tuple[StoredMessage, ...]
    summaries: tuple[SummaryRecord, ...]
    size: int  # estimated bytes


class SessionCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Slot, CachedSession] = OrderedDict()
        self._size = 0
        self.hits = 0
        self.catch_ups = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Estimated bytes held across every cached session, their keys included."""
        return self._size

    def known(self, key: SessionKey, spec: LoadSpec) -> CachedSession | None:
        """What is held for the session: its version and head are a load's ``known_version``
        and ``known_head``."""
        return self._entries.get(_slot(key, spec))

    def holds_all(self, key: SessionKey, spec: LoadSpec) -> bool:
        """The cached page held every active message when it was cached: it reads from the
        start of the log and is shorter than its limit."""
        entry = self._entries.get(_slot(key, spec))
        return entry is not None and spec.since == "all" and len(entry.messages) < spec.limit

    def fill(
        self,
        key: SessionKey,
        spec: LoadSpec,
        snapshot: SessionSnapshot,
        known: CachedSession | None = None,
    ) -> bool:
        """After a load: complete an unchanged or grown snapshot from the cache, or cache a
        full one. ``known``: the entry the load passed. False when an unchanged or grown
        snapshot's entry changed or left the cache during the load, or the messages read do
        not continue it: the caller loads again without a known version."""
        slot = _slot(key, spec)
        if snapshot.grown:
            return self._catch_up(slot, spec, snapshot, known)
        if snapshot.unchanged:
            entry = self._entries.get(slot)
            if entry is None or entry.version != snapshot.meta.version:
                return False
            self._entries.move_to_end(slot)
            self.hits += 1
            snapshot.messages = list(entry.messages)
            snapshot.summaries = list(entry.summaries)
            snapshot.unchanged = False
            return True
        self.misses += 1
        if snapshot.exists:
            messages = tuple(snapshot.messages)
            self._put(slot, CachedSession(
                snapshot.meta.version, snapshot.meta.head_seq, messages,
                tuple(snapshot.summaries), estimated_bytes(messages),
            ))  # fmt: skip
        else:
            self._drop(slot)
        return True

    def repaged(self, key: SessionKey, spec: LoadSpec, snapshot: SessionSnapshot) -> None:
        """A page that paging (proxy/turn/paging.py) grew by older messages or trimmed at its
        start, held in place of the one loaded at the same version."""
        slot = _slot(key, spec)
        entry = self._entries.get(slot)
        if entry is None or entry.version != snapshot.meta.version:
            return
        messages = tuple(snapshot.messages)
        self._put(slot, CachedSession(
            entry.version, entry.head_seq, messages, entry.summaries, estimated_bytes(messages)
        ))  # fmt: skip

    def _catch_up(
        self, slot: Slot, spec: LoadSpec, snapshot: SessionSnapshot, known: CachedSession | None
    ) -> bool:
        """A grown snapshot: the messages appended since ``known``, which must still be the
        entry held, and must continue its chain."""
        entry = self._entries.get(slot)
        if entry is None or entry is not known:
            return False
        new = snapshot.messages
        if new and entry.messages and new[0].chain != chain_hash(
            entry.messages[-1].chain, new[0].fingerprint
        ):
            self._drop(slot)
            return False
        messages, size = _within(spec, (*entry.messages, *new), entry.size + estimated_bytes(new))
        self.catch_ups += 1
        snapshot.messages = list(messages)
        snapshot.summaries = list(entry.summaries)
        snapshot.grown = False
        meta = snapshot.meta
        self._put(slot, CachedSession(
            meta.version, meta.head_seq, messages, entry.summaries, size
        ))  # fmt: skip
        return True

    def after_append(
        self,
        key: SessionKey,
        spec: LoadSpec,
        loaded: SessionSnapshot,
        appended: list[StoredMessage],
        stubs: Mapping[int, str | None] | None,
        version: int,
        head_chain: str,
    ) -> None:
        """Apply the proxy's own turn write to the session as ``loaded`` (before the write):
        ``appended`` with their assigned seqs, ``stubs`` set on older messages. Kept only
        when the write was the only one since the load (``version`` is one past
        ``loaded``'s) and the chain the store computed is the one computed here. A session
        the write created is kept when the chain shows it holds only this turn."""
        slot = _slot(key, spec)
        if spec.since == "turn":
            return  # its start moves with every user message: not worth following
        if loaded.exists and version != loaded.meta.version + 1:
            return  # another write came in between
        chain, chains = loaded.meta.head_chain, []
        for record in appended:
            chain = chain_hash(chain, record.fingerprint)
            chains.append(chain)
        if chain != head_chain:
            self._drop(slot)
            return
        # the records are the turn's own, finished with: they take the fields the store
        # assigned, as a load would return them
        for record, chain in zip(appended, chains, strict=True):
            record.chain = chain
            record.compressed_content = record.compressed_content or None
        messages = (*with_stubs(loaded.messages, stubs or {}), *appended)
        size = estimated_bytes(appended)
        current = self._entries.get(slot)
        if current is not None and current.version == loaded.meta.version:
            # the entry the turn loaded, grown by the turn
            size += current.size
        else:
            size += estimated_bytes(loaded.messages)
        messages, size = _within(spec, messages, size)
        if current is not None and current.version > version:
            return  # a later turn of this session already cached a newer state
        head = appended[-1].seq if appended else loaded.meta.head_seq
        self._put(slot, CachedSession(version, head, messages, tuple(loaded.summaries), size))

    def drop_session(self, key: SessionKey) -> None:
        session = (key.namespace, key.agent, key.session)
        for slot in [s for s in self._entries if s[:3] == session]:
            self._drop(slot)

    def _put(self, slot: Slot, entry: CachedSession) -> None:
        self._drop(slot)
        held = entry.size + slot_bytes(slot)
        if slot[4] == "turn" or held > self.max_bytes:
            return
        self._entries[slot] = entry
        self._size += held
        while self._size > self.max_bytes:
            old_slot, oldest = self._entries.popitem(last=False)
            self._size -= oldest.size + slot_bytes(old_slot)

    def _drop(self, slot: Slot) -> None:
        entry = self._entries.pop(slot, None)
        if entry is not None:
            self._size -= entry.size + slot_bytes(slot)
