"""The processes a benchmark run starts: fake upstream, pass-through floor, memory-proxy,
LiteLLM's proxy and redis-server, each a child of the run on a free loopback port.

Every process can be pinned to a set of CPUs (``taskset``): the run keeps the client and
the fake upstream on one core and the server under test on the other.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
PYTHON = os.path.realpath(sys.executable)  # the real binary: py-spy attaches to its pid
LITELLM_VENV = OUT / "venv-litellm"
TOOLS_VENV = OUT / "venv-tools"
LITELLM_MASTER_KEY = "sk-bench-5f1c0a9e2b7d4c6a8e3f1b0d9c7a5e4f"
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def http_status(port: int, path: str, timeout: float = 1.0) -> int | None:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (uvicorn's workers)."""
    found: list[int] = []
    try:
        listing = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return found
    for child in map(int, listing):
        found += [child, *children(child)]
    return found


def status_kb(pid: int, field_name: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of /proc/PID/status, in kB (0 if the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# utime + stime trail the threads' run time by up to a tick or two (they are truncated)
EXITED_SLACK_SECONDS = 0.03


def schedstat(pid: int) -> tuple[int, int]:
    """Nanoseconds the process's live threads ran, and waited runnable for a CPU
    (/proc/PID/task/*/schedstat)."""
    ran = waited = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0, 0
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return ran, waited


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far, to the nanosecond: the time its threads ran
    (``schedstat``). utime + stime count in clock ticks (10 ms): too coarse for a phase of
    a few hundred turns. A thread that exited takes its schedstat with it; once utime +
    stime are ahead by more than their rounding (``EXITED_SLACK_SECONDS``), they are taken
    instead (the servers measured here keep their threads)."""
    ran = schedstat(pid)[0] / 1e9
    ticks = tick_cpu_seconds(pid)
    return ticks if ticks - ran > EXITED_SLACK_SECONDS else ran


def tick_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (exited threads included), in clock ticks."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    # utime and stime: fields 14 and 15 of proc(5), counted after the command name
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_seconds(pid: int) -> float:
    """Time the process's threads spent runnable but waiting for a CPU (``schedstat``)."""
    return schedstat(pid)[1] / 1e9


@dataclass
class Server:
    """One child process serving HTTP on ``port``; ``ready_path`` answers 200 when up."""

    name: str
    argv: list[str]
    port: int
    ready_path: str = "/health"
    env: dict[str, str] = field(default_factory=dict)
    cpus: str | None = None
    cwd: Path | None = None
    log: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    ready_seconds: float | None = None
    _launched: float = 0.0

    def start(self, timeout: float = 60.0) -> Server:
        return self.launch().wait_ready(timeout)

    def launch(self) -> Server:
        """Spawn the process; ``wait_ready`` then waits for its ready path."""
        argv = list(self.argv)
        if self.cpus is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", self.cpus, *argv]  # taskset execs: same pid
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.env}
        self.log = self.log or OUT / "logs" / f"{self.name}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._launched = time.perf_counter()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv, env=env, cwd=self.cwd or OUT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout: float = 60.0) -> Server:
        assert self.process is not None
        deadline = self._launched + timeout
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start; see {self.log}")
            if http_status(self.port, self.ready_path, timeout=0.5) == 200:
                self.ready_seconds = time.perf_counter() - self._launched
                return self
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout}s; see {self.log}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def pids(self) -> list[int]:
        return [self.pid, *children(self.pid)] if self.process else []

    def rss_mb(self) -> float:
        return sum(status_kb(p, "VmRSS") for p in self.pids()) / 1024

    def cpu_seconds(self) -> float:
        """CPU time so far, summed over the process and its workers (``cpu_seconds``)."""
        return sum(cpu_seconds(p) for p in self.pids())

    def runqueue_seconds(self) -> float:
        """Time spent waiting for a CPU while runnable: what other load on the machine
        added to this server's latency."""
        return sum(runqueue_seconds(p) for p in self.pids())

    def peak_rss_mb(self) -> float:
        """Peak RSS summed over the process and its workers (VmHWM)."""
        return sum(status_kb(p, "VmHWM") for p in self.pids()) / 1024

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)  # its own session: workers go too
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fake_upstream(
    cpus: str | None, *, extra: tuple[str, ...] = (), name: str = "fake"
) -> Server:
    port = free_port()
    return Server(
        name, [PYTHON, "-m", "proxy.testing.fake_upstream", "--port", str(port), *extra], port,
        ready_path="/v1/models", cpus=cpus,
    )


def instant_upstream(cpus: str | None) -> Server:
    """The load phases' upstream: the fake's instant replies at the least CPU."""
    port = free_port()
    script = str(ROOT / "bench" / "instant_upstream.py")
    return Server("instant-upstream", [PYTHON, script, "--port", str(port)], port,
                  ready_path="/v1/models", cpus=cpus)


def passthrough(upstream: str, cpus: str | None) -> Server:
    port = free_port()
    script = str(ROOT / "bench" / "passthrough.py")
    return Server("passthrough", [PYTHON, script, "--port", str(port), "--upstream", upstream],
                  port, cpus=cpus)


def memory_proxy(
    name: str, upstream: str, store_url: str, agents_dir: Path, cpus: str | None,
    *, workers: int = 1, env: dict[str, str] | None = None,
) -> Server:
    port = free_port()
    argv = [
        PYTHON, "-m", "proxy.cli", "serve", "--port", str(port), "--store-url", store_url,
        "--upstream-url", upstream, "--agents-dir", str(agents_dir), "--log-level", "warning",
        "--workers", str(workers),
    ]
    return Server(name, argv, port, ready_path="/ready", cpus=cpus, env=dict(env or {}))


def litellm_available() -> str | None:
    """None when LiteLLM's proxy can run here, else why not."""
    binary = LITELLM_VENV / "bin" / "litellm"
    if not binary.exists():
        return (f"LiteLLM's proxy is not installed in {LITELLM_VENV.relative_to(ROOT)} "
                "(see bench/README.md: python bench/run.py --install-litellm)")
    return None


def litellm_proxy(upstream: str, model: str, cpus: str | None) -> Server:
    port = free_port()
    config = OUT / "litellm.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    # no database, no callbacks: the proxy alone in front of the same fake
    config.write_text(
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: {upstream}\n"
        "      api_key: sk-fake\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
    )
    argv = [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(config), "--host", LOOPBACK,
            "--port", str(port), "--telemetry", "False"]
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no cost-map download at import
        "LITELLM_MASTER_KEY": LITELLM_MASTER_KEY,
        "LITELLM_LOG": "ERROR",
        "PYTHONPATH": "",
    }
    return Server("litellm", argv, port, ready_path="/health/liveliness", env=env, cpus=cpus)


def redis_server(cpus: str | None) -> Server:
    port = free_port()
    data = OUT / "redis"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    argv = [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(port),
            "--bind", LOOPBACK, "--dir", str(data), "--save", "", "--appendonly", "no"]
    server = Server("redis", argv, port, cpus=cpus)
    server.ready_path = ""  # not HTTP: see start_redis
    return server


def start_redis(server: Server, timeout: float = 10.0) -> Server:
    """redis-server answers PING, not HTTP."""
    argv = ["taskset", "-c", server.cpus, *server.argv] if server.cpus else server.argv
    server.log = OUT / "logs" / "redis.log"
    server.log.parent.mkdir(parents=True, exist_ok=True)
    with open(server.log, "ab") as log:
        server.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            with socket.create_connection((LOOPBACK, server.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return server
        except OSError:
            time.sleep(0.02)
    server.stop()
    raise RuntimeError("redis-server did not start")


def redis_command(port: int, *args: str) -> bytes:
    """One command over a raw socket (INFO, FLUSHALL): no client library needed."""
    payload = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    with socket.create_connection((LOOPBACK, port), timeout=5) as sock:
        sock.sendall(payload)
        reply = b""
        while True:
            chunk = sock.recv(65536)
            reply += chunk
            if not chunk or _complete(reply):
                return reply


def _complete(reply: bytes) -> bool:
    if reply.startswith(b"$"):
        head, _, rest = reply.partition(b"\r\n")
        size = int(head[1:])
        return size < 0 or len(rest) >= size + 2
    return reply.endswith(b"\r\n")


def redis_commandstats(port: int) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT."""
    text = redis_command(port, "INFO", "commandstats").decode()
    stats: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line.partition(":")
            calls = rest.split(",")[0].split("=")[1]
            stats[name.removeprefix("cmdstat_")] = int(calls)
    return stats
