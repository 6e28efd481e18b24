"""The plan of a run: the requests, rounds and seconds each phase gets, in a full run and
with ``--quick``, and the concurrencies and history sizes it measures."""

from __future__ import annotations

from dataclasses import dataclass

CONCURRENCIES = (1, 8, 32, 64)
HISTORIES = (1, 20, 100, 1000, 10000)
# sizes measured with full-history clients too (10,000 would resend 3 MB every turn)
FULL_HISTORIES = (20, 100, 1000)


@dataclass
class Plan:
    quick: bool
    rounds: int
    round_seconds: float
    throughput_seconds: float
    sse_requests: int
    history_requests: int
    inprocess_turns: int
    profile_seconds: float
    pool_sessions: int
    big_sessions: int  # the "10,000 sessions stored" memory check
    big_session_messages: int
    ready_repeats: int
    workers_seconds: float  # each round of the workers phase
    throughput_rounds: int = 3  # each a cell of throughput_seconds per target and concurrency
    cache_turns: int = 200  # the prompt-cache phase's session (bench/cache.py)

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls(True, 2, 1, 1, 40, 24, 2, 3, 600, 10000, 2, 1, 1, throughput_rounds=1,
                       cache_turns=40)
        return cls(False, 5, 2, 2, 300, 150, 5, 8, 3000, 10000, 10, 3, 2)
