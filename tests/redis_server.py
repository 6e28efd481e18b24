"""A real ``redis-server`` on a free loopback port, for tests.

Used by the store contract suite, the proxy tests and the crash tests::

    server = RedisServer(appendonly=True).start()
    store = RedisStore(server.url)
    server.kill()      # SIGKILL: what survives is what the AOF holds
    server.start()     # same port, same data directory
    server.close()     # stop and remove the data directory
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ports import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def redis_server_available() -> bool:
    return Path(REDIS_SERVER).exists()


class RedisServer:
    """One ``redis-server`` process owned by a test; restartable on the same port and data."""

    def __init__(
        self,
        *,
        appendonly: bool = False,
        port: int | None = None,
        data_dir: str | Path | None = None,
        binary: str = REDIS_SERVER,
    ) -> None:
        self.appendonly = appendonly
        self.binary = binary
        self._fixed_port = port is not None
        self.port = port or free_port()
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="memory-proxy-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server (again) and wait until it answers PING."""
        if self.process is not None and self.process.poll() is None:
            return self
        # a free port can be taken between probing and binding: try a few
        for _ in range(3 if not self._fixed_port else 1):
            self.process = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL)
            if self._wait_ready(timeout):
                return self
            self._terminate()
            if not self._fixed_port:
                self.port = free_port()
        raise RuntimeError(f"redis-server did not start; log:\n{self._log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown (SIGTERM); the data directory is kept for a restart."""
        self._terminate(timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig``; for a terminating signal, wait until the process is gone.

        SIGSTOP/SIGCONT freeze and resume the server (a stalled Redis).
        """
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        if sig not in (signal.SIGSTOP, signal.SIGCONT, signal.SIGTSTP):
            self.process.wait(timeout=10)

    def close(self) -> None:
        """Stop the server and remove a data directory this object created."""
        self.kill(signal.SIGCONT)
        self._terminate()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--logfile", str(self.log_path),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--daemonize", "no",
        ]  # fmt: skip

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            # a server still loading its AOF answers -LOADING, not +PONG
            if self.ping():
                return True
            time.sleep(0.02)
        return False

    def _terminate(self, timeout: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-20:])
        except OSError:
            return "(no log)"


def flush_redis(url: str) -> None:
    """Empty the database behind ``url``, a server or a cluster (``redis+cluster://``: every
    master), from synchronous code: a fixture, a test."""
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    async def flush() -> None:
        if url.startswith("redis+cluster://"):
            cluster = RedisCluster.from_url(url.replace("redis+cluster://", "redis://"))
            await cluster.flushdb(target_nodes=RedisCluster.PRIMARIES)
            await cluster.aclose()
            return
        client = Redis.from_url(url)
        await client.flushdb()
        await client.aclose()

    asyncio.run(flush())
