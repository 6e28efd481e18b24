"""Two proxy processes on one Redis (a server, or a cluster): one overflow is compacted
exactly once, whichever replica serves which turn, and either replica restarts the window
from the summary."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from e2e import CLIENT_KEY, write_agent
from ports import free_port
from redis_server import flush_redis

from proxy.testing.fake_upstream import FakeUpstream, Reply
from proxy.turn.identity import namespace_for
from storage.redis import RedisStore
from strategies.records import LoadSpec, SessionKey, SessionSnapshot
from strategies.summary_prompt import is_summarizer_request
from strategies.tokens import count_message

ROOT = Path(__file__).resolve().parents[2]
AGENT = "shared"


def is_summarizer(body: dict) -> bool:
    return is_summarizer_request(body)


def prompt_tokens(body: dict) -> int:
    """The fake reports the real prompt size, so the sessions' calibration stays at 1."""
    return sum(count_message(m, "gpt-4o") for m in body.get("messages") or [])


class Model:
    """The fake's replies: ``Noted.`` to the agent (after ``delays[turn]`` seconds, or once
    ``holds[turn]`` is set, for the turn whose text starts with that key), a summary after
    ``summary_delay`` seconds."""

    def __init__(self) -> None:
        self.summary_delay = 1.0
        self.delays: dict[str, float] = {}
        self.holds: dict[str, threading.Event] = {}

    def __call__(self, body: dict) -> Reply:
        if is_summarizer(body):
            return Reply.text("SUMMARY: numbered turns of alpha.",
                              first_token_delay=self.summary_delay)
        last = str(body["messages"][-1].get("content", ""))
        delay = next((d for prefix, d in self.delays.items() if last.startswith(prefix)), 0.0)
        hold = next((h for prefix, h in self.holds.items() if last.startswith(prefix)), None)
        return Reply.text("Noted.", first_token_delay=delay, until=hold)


class Replica:
    """``memory-proxy serve`` in its own process."""

    def __init__(self, store_url: str, upstream_url: str, agents_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.log = log.open("wb")
        # the summarizer's transcript call: the tests read what each call was shown
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "MEMORY_PROXY_SUMMARIZER_CACHED_PREFIX": "false"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "--store-url", store_url,
             "--upstream-url", upstream_url, "--agents-dir", str(agents_dir),
             "--port", str(self.port), "--log-level", "info"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"replica exited with {self.process.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("replica did not start")

    def client(self, session: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/agents/{AGENT}/sessions/{session}/v1",
            api_key=CLIENT_KEY, max_retries=0, timeout=30)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.log.close()


@pytest.fixture(scope="module", params=["redis", "cluster"])
def shared_store(request: pytest.FixtureRequest) -> str:
    """The Redis the replicas share: one server, or the cluster (the compaction lock on the
    session's slot)."""
    fixture = "redis_cluster" if request.param == "cluster" else "redis_server"
    return str(request.getfixturevalue(fixture).url)


@pytest.fixture(scope="module")
def cluster(shared_store: str, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[FakeUpstream, Model, list[Replica]]]:
    """One fake upstream and two replicas for the module (starting processes is slow)."""
    root = tmp_path_factory.mktemp("replicas")
    agents = root / "agents"
    agents.mkdir()
    write_agent(agents, AGENT, llm={"model": "gpt-4o", "contextWindow": 2000},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.5})
    model = Model()
    with FakeUpstream.running(default_reply=model, count_tokens=prompt_tokens) as fake:
        started = [Replica(shared_store, fake.url, agents, root / f"replica{i}.log")
                   for i in range(2)]
        try:
            for replica in started:
                replica.wait_ready()
            yield fake, model, started
        finally:
            for replica in started:
                replica.stop()


@pytest.fixture
def replicas(cluster, shared_store) -> tuple[FakeUpstream, Model, list[Replica]]:
    flush_redis(shared_store)
    fake, model, started = cluster
    fake.reset()
    model.summary_delay, model.delays, model.holds = 1.0, {}, {}
    return fake, model, started


def snapshot(url: str, session: str) -> SessionSnapshot:
    async def load() -> SessionSnapshot:
        store = RedisStore(url)
        await store.open()
        try:
            key = SessionKey(namespace_for(CLIENT_KEY), AGENT, session)
            return await store.load(key, LoadSpec(limit=10_000))
        finally:
            await store.close()

    return asyncio.run(load())


def turn(replica: Replica, session: str, n: int) -> None:
    replica.client(session).chat.completions.create(model="gpt-4o", messages=[
        {"role": "system", "content": "sys"},
        {"role": "user", "content": f"turn {n}: " + "alpha " * 250}])


def summarizer_calls(fake: FakeUpstream) -> list[dict]:
    return [r.body for r in fake.chat_requests if is_summarizer(r.body)]


def compactions_started(fake: FakeUpstream) -> int:
    """Compactions run: the first call of each (a compaction too long for one call goes
    on in calls that build on the summary before; none of these sessions had one)."""
    return sum("## Previous summary" not in b["messages"][1]["content"]
               for b in summarizer_calls(fake))


def transcripts(fake: FakeUpstream) -> str:
    return "\n".join(b["messages"][1]["content"] for b in summarizer_calls(fake))


def at_once(*calls: Callable[[], None]) -> None:
    """Run ``calls`` in parallel threads; re-raise the first failure."""
    errors: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if errors:
        raise errors[0]


def settle(condition: Callable[[], bool], *, timeout: float = 15, quiet: float = 1.5) -> None:
    """Wait until ``condition`` holds, then a while longer for any late duplicate."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    time.sleep(quiet)


def test_turns_alternating_between_replicas_compact_one_overflow_once(replicas, shared_store):
    fake, model, (a, b) = replicas
    model.summary_delay = 0.2
    n = 0
    while not summarizer_calls(fake):
        n += 1
        assert n <= 8, "the session never crossed the ratio"
        turn((a, b)[n % 2], "alt", n)
        # the compaction starts right after the response, in the background
        deadline = time.monotonic() + 0.5
        while not summarizer_calls(fake) and time.monotonic() < deadline:
            time.sleep(0.02)
    settle(lambda: bool(snapshot(shared_store, "alt").summaries), quiet=0.5)
    [record] = snapshot(shared_store, "alt").summaries
    assert (record.kind, record.from_seq, record.to_seq) == ("compaction", 1, 2 * n)
    # the other replica restarts the window from the summary the first one wrote
    turn((a, b)[(n + 1) % 2], "alt", n + 1)
    sent = fake.chat_requests[-1].body["messages"]
    assert "SUMMARY: numbered turns" in sent[1]["content"]
    assert sent[2]["content"].startswith(f"turn {n + 1}:")
    time.sleep(0.5)
    assert compactions_started(fake) == 1
    assert len(snapshot(shared_store, "alt").messages) == 2 * (n + 1)


def test_two_replicas_crossing_the_ratio_at_once_compact_exactly_once(replicas, shared_store):
    fake, model, (a, b) = replicas
    for n in range(1, 4):
        turn((a, b)[n % 2], "both", n)
    time.sleep(0.3)
    assert not summarizer_calls(fake)  # three turns stay under the ratio
    # both replicas serve a turn that crosses the ratio, at the same moment (the slow
    # replies make both load the session before either stores its turn)
    model.delays = {"turn 4:": 0.5, "turn 5:": 0.5}
    at_once(lambda: turn(a, "both", 4), lambda: turn(b, "both", 5))
    agent_calls = [r.body for r in fake.chat_requests if not is_summarizer(r.body)]
    assert len(agent_calls) == 5
    assert [len(body["messages"]) for body in agent_calls[-2:]] == [8, 8]  # both saw 3 turns
    settle(lambda: bool(snapshot(shared_store, "both").summaries), quiet=1.0)
    assert compactions_started(fake) == 1
    state = snapshot(shared_store, "both")
    [record] = state.summaries
    assert record.kind == "compaction" and record.from_seq == 1
    assert state.meta.boundary_seq == record.to_seq
    assert len(state.messages) == 10  # nothing lost
    # each turn is either in the summary or still live on the next turn: never lost
    turn(b, "both", 6)
    sent = fake.chat_requests[-1].body["messages"]
    transcript = transcripts(fake)
    for n in range(1, 6):
        summarized = f"USER: turn {n}:" in transcript
        live = any(str(m["content"]).startswith(f"turn {n}:") for m in sent)
        assert summarized != live, n


def test_a_replica_that_planned_before_another_compacted_does_not_summarize_again(
    replicas, shared_store
):
    fake, model, (a, b) = replicas
    model.summary_delay = 0.0
    for n in range(1, 4):
        turn((a, b)[n % 2], "late", n)
    # both load the session at once; replica b answers only after replica a compacted and
    # released the lock: b's plan is stale and must not reach the summarizer
    compacted = threading.Event()
    model.delays, model.holds = {"turn 4:": 0.3}, {"turn 5:": compacted}

    def a_then_release() -> None:
        turn(a, "late", 4)
        # b's turn reached the upstream, so it loaded the session before a compacted
        settle(lambda: any(str(r.body["messages"][-1]["content"]).startswith("turn 5:")
                           for r in fake.chat_requests), quiet=0)
        settle(lambda: bool(snapshot(shared_store, "late").summaries), quiet=0.2)
        compacted.set()

    at_once(a_then_release, lambda: turn(b, "late", 5))
    settle(lambda: bool(snapshot(shared_store, "late").summaries), quiet=0.5)
    assert compactions_started(fake) == 1
    state = snapshot(shared_store, "late")
    [record] = state.summaries
    assert (record.from_seq, record.to_seq) == (1, 8)
    assert [m.content[:7] for m in state.messages[8:] if m.role == "user"] == ["turn 5:"]
