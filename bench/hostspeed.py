"""How fast the host runs this machine's CPUs at a moment.

A fixed pure-Python loop is timed (CPU time, not wall time) on the server's CPU between
measurements. On a shared host the same loop takes up to twice as long from one minute to
the next (measured here: 0.24 to 0.44 s for 3 million additions within a minute), and
every target measured meanwhile costs more CPU per request. The probes of a run say
whether it ran at the host's full speed; the fastest probe is the nearest to it.
"""

from __future__ import annotations

import os
import statistics
import time

# about 8 ms at full speed: short next to a measurement, long next to a scheduler tick
PROBE_ADDITIONS = 250_000


class HostSpeed:
    def __init__(self, cpus: str | None) -> None:
        self.cpus = {int(cpu) for cpu in cpus.split(",")} if cpus else None
        self.samples: list[float] = []  # milliseconds of CPU per probe

    def probe(self) -> float:
        """One probe on the server's CPU (this process moves there for it)."""
        previous = os.sched_getaffinity(0)
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)
        try:
            started = time.process_time()
            total = 0
            for number in range(PROBE_ADDITIONS):
                total += number
            elapsed = 1000 * (time.process_time() - started)
        finally:
            os.sched_setaffinity(0, previous)
        self.samples.append(elapsed)
        return elapsed

    def summary(self) -> dict[str, float] | None:
        if not self.samples:
            return None
        return {
            "probes": len(self.samples),
            "fastest": min(self.samples),
            "median": statistics.median(self.samples),
            "slowest": max(self.samples),
        }
