"""``SOAK=1`` runs the suite's long forms: many more property-test examples, repetitions
and fuzz inputs. Without it, the counts are the ones an everyday run affords."""

from __future__ import annotations

import os

SOAK = os.environ.get("SOAK") == "1"


def scaled(short: int, long: int) -> int:
    """``long`` under ``SOAK=1``, else ``short``."""
    return long if SOAK else short


def examples(soak: int, *, divisor: int = 4, floor: int = 25) -> int:
    """A property test's example count: ``soak`` under ``SOAK=1``, else a quarter of it
    (at least ``floor``)."""
    return soak if SOAK else max(floor, soak // divisor)
