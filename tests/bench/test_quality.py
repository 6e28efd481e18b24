"""The memory-quality benchmark: its conversation generator, its reader of LoCoMo's
format (on a tiny hand-made file) and a tiny replay through the proxy."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import conversations
import quality
import quality_report
import quality_upstream


def test_the_generator_is_deterministic_and_every_question_names_stored_evidence():
    first = conversations.generate(2, seed=7, sessions=6, turns=8, tool_every=2)
    again = conversations.generate(2, seed=7, sessions=6, turns=8, tool_every=2)
    assert first == again
    for conversation in first:
        turns = {t.dia_id: t for t in conversation.turns()}
        assert len(conversation.sessions) == 6 and all(s.date_time for s in conversation.sessions)
        assert {t.speaker for t in turns.values()} == set(conversation.speakers)
        assert any(t.tool for t in turns.values())
        kinds = {q.kind for q in conversation.questions}
        assert {"single-hop", "temporal", "multi-hop", "update", "tool"} <= kinds
        for question in conversation.questions:
            assert question.evidence and set(question.evidence) <= set(turns)
            for dia_id in question.evidence:
                turn = turns[dia_id]
                assert conversation.needle(dia_id) in (turn.tool["result"] if turn.tool
                                                       else turn.text)
            if question.ask_after is not None:
                order = list(turns)
                assert all(order.index(e) <= order.index(question.ask_after)
                           for e in question.evidence)


def test_a_locomo_format_file_is_read_with_its_sessions_dates_and_evidence(tmp_path):
    sample = {
        "sample_id": "tiny-1",
        "conversation": {
            "speaker_a": "Ana", "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": "I got a new bike."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Nice, what colour?"},
            ],
            "session_2_date_time": "10:00 am on 20 May, 2023",
            "session_2": [
                {"speaker": "Ana", "dia_id": "D2:1", "text": "It is red."},
                {"speaker": "Ana", "dia_id": "D2:2", "text": "And fast."},
                {"speaker": "Bo", "dia_id": "D2:3", "text": "Cool."},
            ],
        },
        "qa": [
            {"question": "What colour is Ana's bike?", "answer": "red",
             "evidence": ["D1:1", "D2:1"], "category": 1},
            {"question": "When did Ana get a bike?", "answer": "8 May 2023",
             "evidence": ["D1:1"], "category": 2},
            {"question": "Unanswerable", "adversarial_answer": "none", "evidence": [],
             "category": 5},
        ],
    }
    path = tmp_path / "locomo-tiny.json"
    path.write_text(json.dumps([sample]))
    [conversation] = conversations.read_locomo(path)
    assert conversation.id == "tiny-1" and conversation.speakers == ("Ana", "Bo")
    assert [s.date_time for s in conversation.sessions] == [
        "1:56 pm on 8 May, 2023", "10:00 am on 20 May, 2023"]
    assert [t.dia_id for t in conversation.turns()] == ["D1:1", "D1:2", "D2:1", "D2:2", "D2:3"]
    assert [(q.kind, q.evidence) for q in conversation.questions] == [
        ("multi-hop", ["D1:1", "D2:1"]), ("temporal", ["D1:1"])]
    assert conversation.needle("D2:1") == "It is red."
    # consecutive turns of the first speaker go in one request, the other's as the reply
    requests = quality.exchanges(conversation)
    assert [[m["content"] for m in group] for group, _ in requests] == [
        ["[1:56 pm on 8 May, 2023] Ana: I got a new bike."],
        ["[10:00 am on 20 May, 2023] Ana: It is red.", "Ana: And fast."],
    ]


def test_a_cache_hit_is_scored_with_openais_prefix_rule():
    upstream = quality_upstream.Upstream()
    long = {"role": "system", "content": "memory " * 1500}
    upstream({"messages": [long, {"role": "user", "content": "one"}]})
    upstream({"messages": [long, {"role": "user", "content": "one"},
                           {"role": "assistant", "content": "two"}]})
    upstream({"messages": [{"role": "system", "content": "other " * 1500}]})
    cache = upstream.cache
    assert (cache.requests, cache.hits) == (2, 1)
    assert cache.cached_tokens % 128 == 0 and 1024 <= cache.cached_tokens <= 1510


def test_a_tiny_replay_measures_every_strategy_and_leaves_the_sessions_unchanged():
    tiny = conversations.generate(1, seed=3, sessions=4, turns=12, tool_every=2, tool_rows=20)
    results = asyncio.run(quality.measure_async(tiny))
    configs = {(c["strategy"], c["window"]): c for c in results["configs"]}
    assert len(configs) == len(quality.STRATEGIES) * 3
    assert all(c["store_checks"] == c["store_unchanged"] > 0 for c in configs.values())
    assert configs[("full", "fits")]["recall_exact"] == 1.0
    assert configs[("none", "fits")]["recall_exact"] < 0.5
    fits = configs[("summarizing_window", "fits")]
    assert fits["recall_exact"] == 1.0 and fits["cache"]["requests"] > 0
    assert configs[("summarizing_window", "quarter")]["tokens_per_question"] < \
        fits["tokens_per_question"]
    assert quality_report.render(results)[0] == quality_report.SECTION
