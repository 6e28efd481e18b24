"""Where a server's CPU goes below Python: ``perf record`` on every thread of the process,
grouped by the shared object the samples fall in (the CPython interpreter, the kernel,
SQLite, uvloop, orjson...). py-spy shows which Python code runs; this shows what share of
the CPU is the interpreter executing it at all, which bounds what a Python proxy can do.
Optional: without ``perf`` (or without the permission to use it) the phase is skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

PERF = shutil.which("perf")
_ROW = re.compile(r"^\s*([\d.]+)%\s+(\S.*?)\s*$")
# shared objects by what they are, for the report
KINDS = (
    ("libpython", "the CPython interpreter (bytecode, objects, GC)"),
    ("[kernel", "the kernel (loopback sockets, wake-ups, file writes)"),
    ("libsqlite3", "SQLite"),
    ("libc.so", "libc (malloc, memcpy)"),
    ("loop.cpython", "uvloop"),
)


def start(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    if PERF is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [PERF, "record", "-F", "499", "-p", str(pid), "-o", str(out), "--",
            "sleep", f"{seconds:.1f}"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finish(process: subprocess.Popen[bytes] | None, out: Path) -> dict[str, float] | str:
    """Share of samples per shared object, largest first; a reason string when perf did
    not run."""
    if process is None:
        return "perf is not installed"
    if process.wait() != 0 or not out.exists():
        return "perf record failed (kernel.perf_event_paranoid, or no permission)"
    report = subprocess.run(
        [PERF or "perf", "report", "-i", str(out), "--sort", "dso", "--no-children",
         "-g", "none", "--stdio"],
        capture_output=True, text=True, check=False,
    )
    shares: dict[str, float] = {}
    for line in report.stdout.splitlines():
        if line.startswith("#"):
            continue
        match = _ROW.match(line)
        if match:
            shares[match.group(2)] = float(match.group(1)) / 100
    return shares or "perf recorded no samples"


def kind(dso: str) -> str:
    for prefix, label in KINDS:
        if dso.startswith(prefix):
            return label
    return dso
