"""The memory a ``memory-proxy serve`` process keeps after turns with huge ``model``
strings: RSS before and after 20 turns on new sessions, each with a 10 MB model id
(docs/RELIABILITY.md, round 2). Before identifiers were bounded, every turn was served
and the caches keyed by the model kept each string; now each is a 400.

    python bench/long_model_rss.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import _paths  # the repository root on sys.path (used for cwd below too)
import httpx

from proxy.testing.fake_upstream import FakeUpstream

TURNS = 20
MODEL_BYTES = 10_000_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    with FakeUpstream.running() as fake, tempfile.TemporaryDirectory() as directory:
        port = free_port()
        env = {**os.environ, "MEMORY_PROXY_PORT": str(port),
               "MEMORY_PROXY_STORE_URL": f"sqlite:///{directory}/memory.db",
               "MEMORY_PROXY_UPSTREAM_URL": fake.url, "MEMORY_PROXY_AGENTS_DIR": directory,
               "MEMORY_PROXY_LOG_LEVEL": "warning"}
        proxy = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve"], env=env,
                                 cwd=_paths.ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}/agents/a/sessions"
        try:
            with httpx.Client(timeout=60, headers={"Authorization": "Bearer sk-bench"}) as http:
                for _ in range(300):
                    try:
                        http.get(f"http://127.0.0.1:{port}/health")
                        break
                    except httpx.TransportError:
                        time.sleep(0.1)
                hello = [{"role": "user", "content": "hi"}]
                http.post(f"{base}/warm/v1/chat/completions",
                          json={"model": "gpt-4o", "messages": hello})
                before = rss_mb(proxy.pid)
                statuses = [
                    http.post(f"{base}/s{n}/v1/chat/completions", json={
                        "model": f"{n}" + "m" * MODEL_BYTES, "messages": hello}).status_code
                    for n in range(TURNS)
                ]
                time.sleep(1)
                after = rss_mb(proxy.pid)
        finally:
            proxy.terminate()
            proxy.wait()
    print(f"turns={TURNS} model_bytes={MODEL_BYTES} statuses={sorted(set(statuses))} "
          f"rss_before_mb={before} rss_after_mb={after}")


if __name__ == "__main__":
    main()
