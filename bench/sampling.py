"""Sampling profiles of a server under load with py-spy, reduced to the top frames.

``py-spy record --format raw`` writes collapsed stacks (``frame;frame;... count``); the
run keeps them under bench/out/ and puts the top self-time and inclusive frames, by file
and function, into RESULTS.md.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from servers import TOOLS_VENV

# "function (path/to/file.py:123)"
OWN_CODE = ("proxy/", "storage/", "strategies/")
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    local = TOOLS_VENV / "bin" / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


@dataclass
class Profile:
    samples: int
    framework_only: float  # share of samples whose stack holds no memory-proxy frame
    self_time: list[tuple[str, float]]  # (frame, share of samples)
    inclusive: list[tuple[str, float]]
    raw: Path


def start(
    pid: int, seconds: float, out: Path, rate: int = 250, *, gil: bool = False
) -> subprocess.Popen[bytes] | None:
    binary = py_spy()
    if binary is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [binary, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
            "--rate", str(rate), "--format", "raw", "--nonblocking", *(["--gil"] if gil else []),
            "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen[bytes] | None, out: Path, top: int = 15) -> Profile | str:
    """The reduced profile, or why there is none."""
    if process is None:
        return "py-spy is not installed (python bench/run.py --install-tools)"
    _, err = process.communicate(timeout=120)
    if not out.exists():
        return f"py-spy failed: {err.decode(errors='replace').strip()[:300]}"
    return summarize(out, top)


def _name(frame: str) -> str:
    match = FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match['func']} ({path})"


def summarize(raw: Path, top: int = 15) -> Profile:
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = foreign = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        frames = [_name(f) for f in stack.split(";")]
        # the thread name py-spy puts first is not a frame
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += samples
        if not any(m in f for f in frames[1:] for m in OWN_CODE if "proxy/cli.py" not in f):
            foreign += samples
        self_time[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    share = (lambda n: n / total) if total else (lambda n: 0.0)
    return Profile(
        samples=total,
        framework_only=share(foreign),
        self_time=[(f, share(n)) for f, n in self_time.most_common(top)],
        inclusive=[(f, share(n)) for f, n in inclusive.most_common()],
        raw=raw,
    )
