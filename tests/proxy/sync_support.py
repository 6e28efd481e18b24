"""A reference for history sync's tests: the store's probe match computed from a page held
in memory (every active message of a session, in order)."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.turn.history_sync import Fingerprints
from strategies.records import StoredMessage


def match_page(resent: Fingerprints, page: Sequence[StoredMessage]) -> tuple[int, int]:
    """What the store answers a probe with (``SessionSnapshot.matched``, ``matched_seq``),
    from a page that holds every active message of the session, in order: the longest
    common prefix of the resent conversation and the page. Chains are cumulative over the
    active log, so a probe chain is found exactly when its whole prefix is."""
    count = min(len(resent.conversation), len(page))
    index = 0
    while index < count and resent.matches(index, page[index]):
        index += 1
    return index, page[index - 1].seq if index else 0


