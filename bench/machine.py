"""The machine a run measures on: its description for the report's machine line, and its
CPU counters, read around the run (steal) and around each cell of the workers phase (idle
time, the CPU of the children reaped meanwhile)."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import time
from pathlib import Path

from servers import ROOT


def machine() -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    return {
        "cpu": f"{os.cpu_count()} x {cpu}",
        "memory": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _cpu_fields() -> list[int]:
    """The machine's CPU time so far, in ticks, by kind (the ``cpu`` line of /proc/stat:
    user, nice, system, idle, iowait, irq, softirq, steal)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def cpu_ticks() -> tuple[int, int]:
    """The machine's steal and total CPU time so far, in ticks: steal is the time the
    hypervisor ran other guests while this one had work to run."""
    fields = _cpu_fields()
    return fields[7], sum(fields)


def idle_ticks() -> tuple[int, int]:
    """The machine's idle (idle + iowait) and total CPU time so far, in ticks."""
    fields = _cpu_fields()
    return fields[3] + fields[4], sum(fields)


def reaped_children_cpu() -> float:
    """CPU seconds of this process's children that have exited and been waited for (wrk)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
