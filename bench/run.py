"""The benchmark, one command: ``python bench/run.py`` (``--quick`` for a smoke run).

Starts every process as a child of this one, measures the targets side by side, and
writes bench/RESULTS.md (raw numbers in bench/out/results.json). See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import _paths  # noqa: F401  (the repository's packages)
import cache as prompt_cache_bench
import report
import report_cache
import sampling
import servers
from machine import cpu_ticks, loadavg, machine
from run_phases import Run
from run_plan import Plan
from servers import LITELLM_VENV, OUT, ROOT, TOOLS_VENV


def cpu_layout() -> tuple[str | None, str | None]:
    """(environment CPUs, server CPUs): client, fake upstream and redis on core 0, the
    server under test alone on core 1. No pinning on a one-core machine."""
    if (os.cpu_count() or 1) < 2:
        return None, None
    return "0", "1"


def ensure_venv(venv: Path, packages: list[str], allowed: bool) -> str | None:
    """Create ``venv`` with ``packages`` unless it exists; None on success, else why not."""
    if (venv / "bin" / "python").exists():
        return None
    if not allowed:
        return f"{venv.relative_to(ROOT)} is missing and --no-install was given"
    print(f"installing {' '.join(packages)} into {venv.relative_to(ROOT)} ...", flush=True)
    log = OUT / "logs" / f"install-{venv.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], stdout=out, stderr=out)
        if made.returncode == 0:
            made = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *packages],
                                  stdout=out, stderr=out)
    if made.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        return f"pip install {' '.join(packages)} failed: {' / '.join(tail)}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (~2 min)")
    parser.add_argument("--no-install", action="store_true",
                        help="do not create bench/out/venv-* (LiteLLM's proxy, py-spy)")
    parser.add_argument("--skip-litellm", action="store_true", help="leave out target D")
    parser.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    parser.add_argument("--locomo", type=Path,
                        help="a LoCoMo-format JSON file of your own for the memory-quality phase")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report from bench/out/results.json, measure nothing")
    parser.add_argument("--cache-only", action="store_true",
                        help="run the prompt-cache phase alone (bench/cache.py, in process) "
                             "and rewrite its section of the report")
    args = parser.parse_args(argv)
    if args.cache_only:
        turns = Plan.make(args.quick).cache_turns
        output = Path(args.output)
        measured = asyncio.run(prompt_cache_bench.measure(turns))
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "cache.json").write_text(json.dumps(measured, indent=1))
        output.write_text(report_cache.with_cache_section(output.read_text(), measured))
        return 0
    if args.report_only:
        Path(args.output).write_text(report.render(saved_results()))
        return 0
    plan = Plan.make(args.quick)
    command = "python bench/run.py" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": command, "plan": asdict(plan), "machine": machine(),
                     "load_before": loadavg(), "notes": []}
    started = time.perf_counter()
    steal_before, total_before = cpu_ticks()

    litellm_reason = None
    if args.skip_litellm:
        litellm_reason = "left out with --skip-litellm"
    else:
        litellm_reason = ensure_venv(LITELLM_VENV, ["litellm[proxy]"], not args.no_install)
        litellm_reason = litellm_reason or servers.litellm_available()
    tools_reason = ensure_venv(TOOLS_VENV, ["py-spy"], not args.no_install)
    if tools_reason:
        results["notes"].append(f"no profile: {tools_reason}")
    results["litellm"] = litellm_reason

    env_cpus, sut_cpus = cpu_layout()
    results["cpus"] = {"environment": env_cpus, "server": sut_cpus}
    with Run(plan, env_cpus, sut_cpus, litellm_reason, args.locomo) as run:
        run.measure(results)
        results["host_speed"] = run.speed.summary()
    results["seconds"] = time.perf_counter() - started
    results["load_after"] = loadavg()
    steal_after, total_after = cpu_ticks()
    results["steal_percent"] = (
        100 * (steal_after - steal_before) / max(1, total_after - total_before)
    )
    (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))
    Path(args.output).write_text(report.render(results))
    print(f"wrote {args.output} in {results['seconds']:.0f} s", flush=True)
    return 0


def saved_results() -> dict:
    """results.json as ``measure`` left it: integer keys back, profiles re-read."""
    results = json.loads((OUT / "results.json").read_text())
    for name in ("throughput", "histories", "workers"):
        results[name] = {int(k): v for k, v in results[name].items()}
    for counts in results["workers"].values():
        for key in list(counts):
            counts[int(key)] = counts.pop(key)
    for key, entry in results["profiles"].items():
        raw = OUT / "profiles" / f"{key.replace(chr(39), '2')}.txt"
        if raw.exists():
            entry["profile"] = sampling.summarize(raw)
    return results


if __name__ == "__main__":
    sys.exit(main())
