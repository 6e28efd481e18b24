"""Helpers of the reliability suite: soak scaling, a proxy in a child process, store dumps.

``SOAK=1`` runs the ``soak``-marked tests long (many repetitions, many fuzz inputs); without
it they run in a short form that CI affords.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
from ports import free_port
from soak import SOAK, scaled

__all__ = ["SOAK", "scaled"]  # the reliability tests import them from here

REPO = Path(__file__).resolve().parents[2]


def report(name: str, **figures: Any) -> None:
    """Print a measured figure (``pytest -s`` shows it; docs/RELIABILITY.md quotes it)."""
    values = " ".join(f"{key}={value}" for key, value in figures.items())
    print(f"\n[reliability] {name}: {values}", flush=True)


def is_openai_error(body: Any) -> bool:
    """``{"error": {"message", "type", "param", "code"}}`` with a non-empty message."""
    if not isinstance(body, dict) or set(body) != {"error"}:
        return False
    error = body["error"]
    return (
        isinstance(error, dict)
        and set(error) == {"message", "type", "param", "code"}
        and isinstance(error["message"], str)
        and bool(error["message"])
        and isinstance(error["type"], str)
    )


class ProxyProcess:
    """``python -m proxy.cli serve`` in a child process, configured through the environment,
    so a test can ``kill -9`` it and start it again on the same port and store."""

    def __init__(self, port: int, env: Mapping[str, str], log_path: Path) -> None:
        self.port = port
        self.env = {**os.environ, **env, "MEMORY_PROXY_PORT": str(port),
                    "MEMORY_PROXY_HOST": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ProxyProcess:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve"],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"proxy exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.base}/health", timeout=0.5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"proxy did not start: {self.log_path.read_text()[-3000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=15)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


def start_proxies(count: int, env: Mapping[str, str], root: Path) -> list[ProxyProcess]:
    """``count`` proxy processes on free ports, started at once (each takes seconds)."""
    processes = [ProxyProcess(free_port(), env, root / f"proxy-{n}.log") for n in range(count)]
    starting = [threading.Thread(target=p.start) for p in processes]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join(60)
    return processes
