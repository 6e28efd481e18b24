"""Incremental server-sent events parser.

Bytes arrive in arbitrary pieces; ``SSEParser.feed`` returns the events completed so far,
each with its exact raw bytes (forwarded to the client untouched) and its joined ``data``
payload. Events end at a blank line (``\\n\\n``, ``\\r\\n\\r\\n`` or a mix of the two).
Lines ending in a lone ``\\r`` are not supported (no model provider sends them).

An event with no ``data:`` line (a ``: ping`` comment, an ``event:``-only block) is still
returned, with ``data == b""``, so keep-alives can be forwarded; consumers skip it.
"""

from __future__ import annotations

import re

from proxy.upstreams.base import SSEEvent

__all__ = ["SSEParser", "parse_sse"]

# every blank-line terminator once CRLF line endings are in play
_CRLF_SEPARATOR = re.compile(rb"\r\n\r\n|\n\n|\n\r\n|\r\n\n")


def _data_of(block: bytes) -> bytes:
    """The joined ``data`` field of one event (``block`` excludes the blank line)."""
    if b"\n" not in block and b"\r" not in block:
        # one line: by far the most common shape (`data: {...}`)
        if block.startswith(b"data:"):
            return block[6:] if block[5:6] == b" " else block[5:]
        return b""
    parts = []
    for line in block.splitlines():
        if line.startswith(b"data:"):
            parts.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line == b"data":
            parts.append(b"")
    return b"\n".join(parts)


class SSEParser:
    """Feed it bytes as they arrive; it returns complete events and keeps the remainder."""

    __slots__ = ("_buf", "_crlf", "_scan")

    def __init__(self) -> None:
        self._buf = b""
        self._crlf = False  # switches to the slower separator search once a CR is seen
        self._scan = 0  # where the separator search resumes in the pending buffer

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buf = self._buf + chunk if self._buf else chunk
        if not self._crlf and b"\r" in chunk:
            self._crlf = True
            self._scan = 0
        events: list[SSEEvent] = []
        start = 0
        pos = self._scan
        if not self._crlf:
            find = buf.find
            while (j := find(b"\n", pos)) >= 0:
                if pos == start and buf[j + 1 : j + 2] == b"\n":
                    # a one-line event (its first newline starts the blank line): by far the
                    # usual `data: {...}`, taken without scanning it again
                    end = j + 2
                    if buf[start : start + 6] == b"data: ":
                        data = buf[start + 6 : j]
                    else:
                        data = _data_of(buf[start:j])
                    events.append(SSEEvent(buf[start:end], data))
                    start = pos = end
                    continue
                i = find(b"\n\n", j)
                if i < 0:
                    break
                end = i + 2
                events.append(SSEEvent(buf[start:end], _data_of(buf[start:i])))
                start = pos = end
        else:
            search = _CRLF_SEPARATOR.search
            while (m := search(buf, pos)) is not None:
                end = m.end()
                events.append(SSEEvent(buf[start:end], _data_of(buf[start : m.start()])))
                start = pos = end
        rest = buf[start:] if start else buf
        self._buf = rest
        # a separator is at most 4 bytes: resume where a partial one could begin
        self._scan = max(0, len(rest) - 3)
        return events

    def flush(self) -> list[SSEEvent]:
        """At end of stream: the last event if the upstream omitted its blank line."""
        rest, self._buf, self._scan = self._buf, b"", 0
        if not rest.strip():
            return []
        return [SSEEvent(raw=rest, data=_data_of(rest.rstrip(b"\r\n")))]


def parse_sse(data: bytes) -> list[SSEEvent]:
    """Parse a whole SSE body at once."""
    parser = SSEParser()
    return parser.feed(data) + parser.flush()
