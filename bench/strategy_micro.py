"""Per-turn cost of the pure strategy work: ``select`` plus the default mapper's ``map``.

Every proxied turn runs the agent's strategy over the loaded history and renders the
window (the select and render steps of proxy/turn/pipeline.py). This times exactly those
two calls, in process, on contexts built the way a turn builds them: stored messages
with seqs and tokens as the store holds them (``populate.history``), the new user
message last, the model's cached counter as ``count_tokens``.

    python bench/strategy_micro.py                   # this checkout
    python bench/strategy_micro.py --baseline DIR    # side by side with DIR/strategies

``--baseline`` runs this script twice more in child processes, once with ``DIR`` ahead of
the repository on ``sys.path`` (another copy of the ``strategies`` package, e.g. one
exported from an earlier commit) and once without, alternating, and prints both with the
ratio. Numbers are the best of several repeats, in CPU µs per call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _import_path(impl: str | None) -> None:
    import _paths  # noqa: F401  (the repository root on sys.path)

    if impl:
        sys.path.insert(0, str(Path(impl).resolve()))


SYSTEM_PROMPT = [
    {
        "role": "system",
        "content": "You are a careful financial analyst. Answer briefly, cite the numbers you "
        "use, and ask before making assumptions about missing regional figures.",
    }
]
TOOL_TEXT = (
    "region,quarter,volume,rate,cost\n"
    + "".join(f"r{i % 7},Q{i % 4 + 1},{1000 + i * 37},{(i * 13) % 97}.{i % 10},{i * 91}\n"
              for i in range(120))
)
# a pasted document above maxMessageRatio of a 128k window: truncated in every window
PASTED_TEXT = "".join(
    f"Section {i}: the carrier contract lists a base rate, a fuel surcharge of {i % 9}.5% and "
    f"a peak season fee for lane {i % 31}; volumes above {1000 + i} pallets get a rebate.\n"
    for i in range(730)
)
SMALL_TOOL_TEXT = '{"status": "ok", "rows": 12, "cached": true}'


def build_cases() -> list[tuple[str, Callable[[str], Any]]]:
    """(name, kind -> WindowContext) for every case; built once, reused by every call."""
    import populate

    from strategies import native
    from strategies.base import WindowContext
    from strategies.config import (
        AutoCompactConfig,
        FullConfig,
        MemoryConfig,
        SummarizingWindowConfig,
        WindowedConfig,
    )
    from strategies.records import StoredMessage, SummaryRecord
    from strategies.tokens import cached_counter, count_message

    model = populate.MODEL
    configs: dict[str, MemoryConfig] = {
        "summarizing_window": SummarizingWindowConfig(),
        "windowed": WindowedConfig(windowSize=100),
        "full": FullConfig(),
        "auto_compact": AutoCompactConfig(),
    }

    def turn_start(messages: list[StoredMessage]) -> int:
        return next(
            (i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), 0
        )

    def numbered(messages: list[StoredMessage]) -> list[StoredMessage]:
        for seq, message in enumerate(messages, start=1):
            message.seq = seq
        return messages

    def text_history(stored: int) -> list[StoredMessage]:
        # ``stored`` messages plus the new user message of the turn
        return numbered(populate.history(stored + 1))

    def record(role: str, content: Any = None, **fields: Any) -> StoredMessage:
        message = StoredMessage(role=role, content=content, **fields)  # type: ignore[arg-type]
        message.tokens = count_message(message, model)
        return message

    def tool_history(turns: int) -> list[StoredMessage]:
        """Turns of user -> assistant calling two tools -> two results -> answer; every
        third turn's first result is large (~1,800 tokens: compression candidates); the
        older half of those already carry their stored stub, as after earlier turns."""
        out: list[StoredMessage] = []
        for turn in range(turns):
            out.append(record("user", f"Turn {turn}: pull the regional costs and compare."))
            calls = [
                {"id": f"call_{turn}_{k}", "type": "function",
                 "function": {"name": "query_costs", "arguments": f'{{"turn": {turn}, "k": {k}}}'}}
                for k in range(2)
            ]
            out.append(record("assistant", None, tool_calls=calls))
            big = turn % 3 == 0
            out.append(record("tool", TOOL_TEXT if big else SMALL_TOOL_TEXT,
                              tool_call_id=f"call_{turn}_0"))
            if big and turn < turns // 2:
                out[-1].compressed_content = (
                    TOOL_TEXT[:300].rstrip()
                    + f"… [{out[-1].tokens} tokens compressed by memory-proxy; "
                    "call the tool again if you need the full output]"
                )
            out.append(record("tool", SMALL_TOOL_TEXT, tool_call_id=f"call_{turn}_1"))
            out.append(record("assistant", populate.ASSISTANT_TEXT.format(i=turn)))
        out.append(record("user", "Now summarize the variance by region."))
        return numbered(out)

    def pasted_history(stored: int) -> list[StoredMessage]:
        """A text history whose first user message carries a long pasted document."""
        messages = populate.history(stored + 1)
        first = messages[0]
        first.content = f"Please keep this contract at hand:\n{PASTED_TEXT}"
        first.tokens = count_message(first, model)
        return numbered(messages)

    def reasoning_history(stored: int) -> list[StoredMessage]:
        """A text history whose replies keep the reasoning item they came with (a
        Responses API session): list content, a native part then the text."""
        messages = populate.history(stored + 1)
        for index, message in enumerate(messages):
            if message.role == "assistant":
                item = {"type": "reasoning", "id": f"rs_{index}", "summary": [],
                        "encrypted_content": "gAAAA" + "x" * 400}
                message.content = [native.part("responses", item),
                                   {"type": "text", "text": message.content}]
                message.tokens = count_message(message, model)
        return numbered(messages)

    def summary(kind: str, to_seq: int) -> SummaryRecord:
        text = "The user is revising the quarterly forecast. " * 40
        return SummaryRecord(kind=kind, text=text, from_seq=1, to_seq=to_seq,  # type: ignore[arg-type]
                             tokens=count_message({"role": "user", "content": text}, model))

    def factory(
        messages: list[StoredMessage],
        *,
        context_window: int = 128_000,
        summary_to: int | None = None,
        placement: str | None = None,
    ) -> Callable[[str], Any]:
        contexts: dict[str, Any] = {}

        def make(kind: str) -> Any:
            if kind not in contexts:
                config = configs[kind]
                summaries = []
                if summary_to is not None:
                    record_kind = "compaction" if kind == "auto_compact" else "summary"
                    summaries = [summary(record_kind, summary_to)]
                if placement is not None and hasattr(config, "summaryPlacement"):
                    config = config.model_copy(update={"summaryPlacement": placement})
                contexts[kind] = WindowContext(
                    config=config,
                    context_window=context_window,
                    messages=messages,
                    summaries=summaries,
                    system_tokens=sum(count_message(m, model) for m in SYSTEM_PROMPT),
                    current_turn_start=turn_start(messages),
                    count_tokens=cached_counter(model),
                    calibration=1.07,
                )
            return contexts[kind]

        return make

    return [
        ("text 20", factory(text_history(20))),
        ("text 40", factory(text_history(40))),
        ("text 100", factory(text_history(100))),
        ("text 500", factory(text_history(500))),
        ("text 500, trimmed (16k)", factory(text_history(500), context_window=16_000)),
        # what a turn on 10,000 stored messages loads: the budget's worth, a little over
        ("text 1,700, trimmed (128k)", factory(text_history(1700))),
        ("tools 30 turns, compression (32k)", factory(tool_history(30), context_window=32_000)),
        ("text 40, one pasted 30k document", factory(pasted_history(40))),
        ("text 100 + summary", factory(text_history(100), summary_to=60)),
        ("text 100 + summary, user msg",
         factory(text_history(100), summary_to=60, placement="USER_MESSAGE")),
        ("reasoning 100, to Responses", factory(reasoning_history(100))),
        ("reasoning 100, to chat", factory(reasoning_history(100))),
    ]


# the API a case's window is rendered for (``MappingContext.api``): chat unless named here
CASE_API = {"reasoning 100, to Responses": "responses"}


def best_per_call(run: Callable[[], Any], *, repeats: int, min_seconds: float) -> float:
    """Best-of-``repeats`` CPU seconds per call, each repeat at least ``min_seconds`` long.
    CPU time of this process, so time spent waiting for a core on a shared machine does
    not count."""
    clock = time.process_time
    number = 1
    while True:
        started = clock()
        for _ in range(number):
            run()
        elapsed = clock() - started
        if elapsed >= min_seconds / 4:
            break
        number *= 2
    number = max(1, int(number * min_seconds / max(elapsed, 1e-9)))
    best = float("inf")
    for _ in range(repeats):
        started = clock()
        for _ in range(number):
            run()
        best = min(best, (clock() - started) / number)
    return best


def measure(*, repeats: int, min_seconds: float, only: str | None) -> list[dict[str, Any]]:
    from strategies.mapper import MappingContext, MessageToLlmMessageMapper
    from strategies.registry import get_strategy

    mapper = MessageToLlmMessageMapper()
    rows: list[dict[str, Any]] = []
    for name, make in build_cases():
        for kind in ("summarizing_window", "windowed", "full", "auto_compact"):
            if only and only not in kind:
                continue
            ctx = make(kind)
            strategy = get_strategy(kind)
            start = ctx.current_turn_start
            mapping = MappingContext(
                model="gpt-4o-mini",
                current_turn_seq=ctx.messages[start].seq if ctx.messages else 0,
                api=CASE_API.get(name, "chat"),
            )
            window = strategy.select(ctx)
            select_s = best_per_call(
                partial(strategy.select, ctx), repeats=repeats, min_seconds=min_seconds
            )
            map_s = best_per_call(
                partial(mapper.map, window, SYSTEM_PROMPT, mapping),
                repeats=repeats,
                min_seconds=min_seconds,
            )
            rows.append({
                "case": name,
                "strategy": kind,
                "select_us": select_s * 1e6,
                "map_us": map_s * 1e6,
                "items": len(window.items),
            })
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':36} {'strategy':20} {'items':>5} {'select':>9} {'map':>8} {'turn µs':>9}")
    for row in rows:
        total = row["select_us"] + row["map_us"]
        print(f"{row['case']:36} {row['strategy']:20} {row['items']:>5} "
              f"{row['select_us']:>9.1f} {row['map_us']:>8.1f} {total:>9.1f}")


def print_comparison(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    print(f"{'case':36} {'strategy':20} {'old sel':>8} {'new sel':>8} {'old map':>8} "
          f"{'new map':>8} {'old turn':>9} {'new turn':>9} {'speedup':>7}")
    for before, after in zip(old, new, strict=True):
        old_total = before["select_us"] + before["map_us"]
        new_total = after["select_us"] + after["map_us"]
        print(f"{before['case']:36} {before['strategy']:20} {before['select_us']:>8.1f} "
              f"{after['select_us']:>8.1f} {before['map_us']:>8.1f} {after['map_us']:>8.1f} "
              f"{old_total:>9.1f} {new_total:>9.1f} {old_total / new_total:>6.2f}x")


def _child(args: argparse.Namespace, impl: str | None) -> list[dict[str, Any]]:
    command = [sys.executable, __file__, "--json", "--repeats", str(args.repeats),
               "--min-seconds", str(args.min_seconds)]
    if impl:
        command += ["--impl", impl]
    if args.only:
        command += ["--only", args.only]
    env = dict(os.environ, PYTHONHASHSEED="0")
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _best_of(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    best = [dict(row) for row in runs[0]]
    for run in runs[1:]:
        for row, other in zip(best, run, strict=True):
            row["select_us"] = min(row["select_us"], other["select_us"])
            row["map_us"] = min(row["map_us"], other["map_us"])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", help="directory holding the strategies package to time")
    parser.add_argument("--baseline", help="directory holding a strategies package to compare")
    parser.add_argument("--rounds", type=int, default=2, help="alternating child runs each")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-seconds", type=float, default=0.05)
    parser.add_argument("--only", help="only strategies whose kind contains this")
    parser.add_argument("--json", action="store_true", help="print raw rows as JSON")
    args = parser.parse_args()

    if args.baseline:
        old_runs, new_runs = [], []
        for _ in range(args.rounds):
            old_runs.append(_child(args, args.baseline))
            new_runs.append(_child(args, None))
        print(f"baseline: {args.baseline}/strategies   current: {HERE.parent}/strategies")
        print_comparison(_best_of(old_runs), _best_of(new_runs))
        return

    _import_path(args.impl)
    rows = measure(repeats=args.repeats, min_seconds=args.min_seconds, only=args.only)
    if args.json:
        print(json.dumps(rows))
    else:
        import strategies

        print(f"strategies: {Path(strategies.__file__).parent}")
        print_rows(rows)


if __name__ == "__main__":
    main()
