"""summarizing_window's maxHistoryFetch is the page size when loading history: pages are
read until the window's budget is full, through the proxy (a delta client, the recording
fake upstream)."""

from __future__ import annotations

from e2e import write_agent
from summarizing_support import (
    MODEL,
    DeltaSession,
    memory_view,
    modified,
    prompt_tokens,
    scripted,
    sized,
    summarizer_requests,
)

WINDOW = 4000
BUDGET = 3200


def paged_agent(agents_dir, name: str, page: int, window: int | None = WINDOW, **config) -> None:
    llm = {"model": MODEL} | ({"contextWindow": window} if window else {})
    # the spec's refit at every request: each window fills the budget (stablePrefix would
    # hold a window's start until the budget is reached, then trim below it)
    write_agent(agents_dir, name, llm=llm, memoryConfig={
        "kind": "summarizing_window", "maxHistoryFetch": page, "stablePrefix": False,
        **config})


def test_a_window_that_holds_the_whole_history_gets_it_through_pages(
    make_proxy, fake, agents_dir
):
    paged_agent(agents_dir, "paged", 5, window=None)
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("paged", "s"), fake)
    for n in range(6):
        session.say(f"question {n}")
    sent = session.sent[-1]
    assert [m["content"] for m in sent.messages if m["role"] == "user"] == [
        f"question {n}" for n in range(6)]
    assert not modified(sent.headers)
    totals = memory_view(proxy, "paged", "s")["totals"]
    assert totals["messages_loaded"] == totals["messages_stored"] == 12
    assert totals["trimmed"] == 0


def test_pages_are_read_until_the_budget_is_full_and_no_further(make_proxy, fake, agents_dir):
    paged_agent(agents_dir, "long", 4)
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("long", "s"), fake)
    for turn in range(30):
        session.say(sized(f"U{turn} remember item {turn}", 300))
    sent = session.sent[-1]
    # the window is full: less than one more turn would have fitted
    assert BUDGET - 320 < prompt_tokens(sent.messages) <= BUDGET
    assert modified(sent.headers)
    totals = memory_view(proxy, "long", "s")["totals"]
    # far more than one page, far less than the history: what the budget holds and the
    # turn before it
    assert 4 < totals["messages_sent"] < totals["messages_loaded"] <= totals["messages_sent"] + 4
    assert totals["messages_stored"] == 60


def test_auto_summarize_fires_on_the_history_the_budget_could_hold_not_on_one_page(
    make_proxy, fake, agents_dir
):
    # a page of four messages is about 620 tokens: far below the trigger of 3,000
    paged_agent(agents_dir, "memo", 4, autoSummarize=True)
    scripted(fake)
    proxy = make_proxy()
    session = DeltaSession(proxy.client("memo", "s"), fake)
    for turn in range(14):
        session.say(sized(f"U{turn} remember item {turn}", 300))
        proxy.drain()
    [request, *_] = summarizer_requests(fake)
    transcript = request.body["messages"][1]["content"]
    assert "U0 remember item 0" in transcript
    assert proxy.snapshot("memo", "s").summaries[0].from_seq == 1


def test_a_history_read_cold_takes_one_range_read_beyond_the_stores_page(
    make_proxy, fake, agents_dir, monkeypatch
):
    paged_agent(agents_dir, "cold", 10, window=16_000)
    scripted(fake)
    session = DeltaSession(make_proxy().client("cold", "s"), fake)
    for turn in range(60):
        session.say(sized(f"U{turn} remember item {turn}", 300))
    # another process: nothing of the session in its cache
    fresh = make_proxy()
    store = fresh.services.store
    reads = []
    read = store.get_range

    async def counted(key, low, high, **budget):
        reads.append((low, high))
        return await read(key, low, high, **budget)

    monkeypatch.setattr(store, "get_range", counted)
    sent = DeltaSession(fresh.client("cold", "s"), fake).say("and now?")
    assert len(reads) == 1
    # the budget (12,800 tokens) holds about 41 of the 60 turns: full, not overfull
    users = [m for m in sent.messages if m["role"] == "user"]
    assert 38 <= len(users) <= 42
    assert 0.9 * 12_800 < prompt_tokens(sent.messages) <= 12_800
