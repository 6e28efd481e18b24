"""``memory-proxy``: ``serve`` runs the proxy; ``demo`` shows it working with no API key."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from proxy.banner import startup_lines
from proxy.settings import Settings

FLAGS = {
    "host": "HOST",
    "port": "PORT",
    "store_url": "STORE_URL",
    "upstream_url": "UPSTREAM_URL",
    "upstream_api_key": "UPSTREAM_API_KEY",
    "agents_dir": "AGENTS_DIR",
    "admin_token": "ADMIN_TOKEN",
    "workers": "WORKERS",
    "log_level": "LOG_LEVEL",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-proxy",
        description="An OpenAI-compatible proxy that gives any LLM agent memory.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the proxy (embedded SQLite store by default)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 4000)")
    serve.add_argument(
        "--store-url",
        help="sqlite:///path, redis://host:port/db, redis+cluster://host:port or "
        "redis+sentinel://host:port/service/db",
    )
    serve.add_argument("--upstream-url", help="OpenAI-compatible base URL (default OpenAI)")
    serve.add_argument(
        "--upstream-api-key", help="key for the upstream (else the client's is forwarded)"
    )
    serve.add_argument("--agents-dir", help="folder of agent definition JSON files")
    serve.add_argument("--admin-token", help="token for /memory and /admin")
    serve.add_argument("--workers", type=int, help="worker processes (use a redis:// store)")
    serve.add_argument("--log-level", help="debug, info, warning, error")
    demo = commands.add_parser(
        "demo", help="a scripted agent session against a built-in fake model"
    )
    demo.add_argument("--turns", type=int, default=8, help="number of user turns")
    return parser


def serve(args: argparse.Namespace) -> int:
    for attr, env in FLAGS.items():
        value = getattr(args, attr, None)
        if value is not None:
            os.environ[f"MEMORY_PROXY_{env}"] = str(value)
    # a serving process (and every worker it forks) tunes the GC after start-up
    os.environ.setdefault("MEMORY_PROXY_TUNE_GC", "true")

    import uvicorn

    settings = Settings()
    if settings.workers > 1 and settings.store_url.startswith("sqlite"):
        print(
            "memory-proxy: several workers share sessions only through Redis; "
            "set --store-url redis://…",
            file=sys.stderr,
        )
        return 2
    print("\n".join(startup_lines(settings)), file=sys.stderr, flush=True)
    uvicorn.run(
        "proxy.http.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers if settings.workers > 1 else None,
        log_level=settings.log_level,
        access_log=False,
        loop="auto",
        http="auto",
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    from proxy.testing.demo import run_demo

    return run_demo(turns=args.turns)


if __name__ == "__main__":
    sys.exit(main())
