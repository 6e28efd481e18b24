"""Checkpoints of the SQLite store's write-ahead log, on a thread and a connection of their
own.

SQLite's autocheckpoint runs inside the commit that crosses its threshold: that turn's
append copies about a thousand pages back into the database and syncs it (4 ms of CPU and
10 ms of wall time measured on the benchmark's sessions), and the store's thread serves
nothing meanwhile: every ~130th turn waited that long, most of the added latency's 99th
percentile. SQLite's documentation suggests the alternative used here: a second connection,
on a thread of its own, runs a ``PASSIVE`` checkpoint every ``CHECKPOINT_ROWS`` rows the
store changed (about a thousand pages of log). A passive checkpoint waits for no reader
or writer: the store's thread goes on reading and committing while it
copies (the sqlite3 module releases the GIL inside SQLite).

The log starts over at the first write after a checkpoint that copied all of it. Under
sustained writes a checkpoint running beside them never finds that (something was written
meanwhile), so the store's connection keeps SQLite's own autocheckpoint, at
``BACKSTOP_PAGES``: the commit that crosses it copies the pages the checkpointer has not
yet (a few, where SQLite's default would copy a thousand), and the log starts over. The
checkpointer leaves it the next turn after finding the log that long (holding the
checkpoint lock then, it would make the store's attempt fail). It also bounds the log
should the checkpointer fail or fall behind a writer faster than its copying.

The store's thread asks after each job (``after_job``: the connection's count of changed
rows, no system call). The checkpointer runs at the process's own priority: a lower one
(tried: niceness 10) let busy serving starve it while it held the checkpoint lock.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

from storage.sqlite_schema import BUSY_TIMEOUT_MS

__all__ = ["BACKSTOP_PAGES", "CHECKPOINT_ROWS", "Checkpointer"]

log = logging.getLogger("memory_proxy.storage")

# rows the store changes between checkpoints: about SQLite's own threshold of 1000 pages
# (a turn writes about two pages of log per row it changes: its rows and their indexes)
CHECKPOINT_ROWS = 500
# pages in the log past which the store's connection checkpoints by itself: it copies
# what the checkpointer has not (a few pages) and the log starts over
BACKSTOP_PAGES = 2000


class Checkpointer:
    """A thread with its own connection that checkpoints the log of the database at
    ``path`` as the store's connection writes to it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._store: sqlite3.Connection | None = None  # the store's, read on its thread
        self._changes_then = 0

    def start(self, store: sqlite3.Connection) -> None:
        """Checkpoint what ``store`` (the store's connection) writes."""
        self._store = store
        self._changes_then = store.total_changes
        self._thread.start()

    def after_job(self) -> None:
        """On the store's thread, after each job: wake the checkpointer when the store
        changed ``CHECKPOINT_ROWS`` rows since the last time."""
        store = self._store
        if store is None:
            return
        changes = store.total_changes
        if changes - self._changes_then >= CHECKPOINT_ROWS:
            self._changes_then = changes
            self._wake.set()

    def stop(self) -> None:
        """Stop the thread (after a checkpoint under way) and close its connection; the
        store's connection is not read again."""
        self._store = None
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None)
        except sqlite3.Error as exc:  # the store's backstop copies instead
            log.warning("sqlite checkpoints of %s off: %s", self.path, exc)
            return
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA synchronous = NORMAL")
            pages = 0  # in the log at the end of the last checkpoint
            while True:
                self._wake.wait()
                if self._stopping:
                    return
                self._wake.clear()
                if pages >= BACKSTOP_PAGES:
                    # the log did not start over: the store's connection does that at its
                    # next commit, unless this thread holds the checkpoint then; so not now
                    pages = 0
                    continue
                try:
                    _, pages, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # the store's backstop copies meanwhile
                    log.warning("sqlite checkpoint of %s failed: %s", self.path, exc)
        finally:
            conn.close()

