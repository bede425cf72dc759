"""``semantic serve``: the HTTP server on the embedded model (or ``--model``)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from semantic.adapters.cli.progress import ProgressPrinter

log = logging.getLogger(__name__)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    serve = sub.add_parser("serve", parents=[common], help="run the HTTP server")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    serve.add_argument(
        "--api-key",
        default=None,
        help="require this key (Authorization: Bearer, or x-api-key) on every "
        "route but /health; default: $SEMANTIC_API_KEY, else none",
    )
    serve.add_argument(
        "--kv-budget-mb",
        type=int,
        default=2048,
        help="memory for KV blocks, MiB (default: %(default)s)",
    )
    serve.add_argument(
        "--prefault-mb",
        type=int,
        default=1024,
        help="memory touched at start so the first restores after a restart do not page-fault,"
        " MiB; at most the KV budget; 0 turns it off (default: %(default)s)",
    )
    serve.add_argument(
        "--kv-at-rest",
        choices=("lossless", "q8", "q4"),
        default="lossless",
        help="how block files hold KV: exact, or 8-/4-bit, 3.6x/6.4x smaller and slightly"
        " different after a restore from disk (default: %(default)s)",
    )
    serve.add_argument(
        "--disk-quota-mb",
        type=int,
        default=None,
        help="disk for KV blocks, MiB; least recently used agents' blocks go first",
    )
    serve.add_argument(
        "--max-tokens-cap",
        type=int,
        default=4096,
        help="largest max_tokens a request may ask for (default: %(default)s)",
    )
    serve.add_argument(
        "--prefill-budget",
        type=_positive(int),
        default=None,
        help="a fixed number of prompt tokens prefilled per engine step (default: 1,024 "
        "while nothing decodes, 64 per waiting prompt while streams decode; docs/adr/0009)",
    )
    serve.add_argument(
        "--prefill-ride",
        type=_decode_steps,
        default=None,
        metavar="STEPS",
        help="a lone waiting prompt's chunk that fits the running streams' decode step (any "
        "chunk, with --prefill-slice 0) rides it, adding at most STEPS decode steps' time; "
        "fewer STEPS: smoother streams, a slower first token for the prompt; 0: passes of "
        "its own (default: 3; docs/adr/0009 shows the curve)",
    )
    serve.add_argument(
        "--prefill-slice",
        type=_decode_steps,
        default=None,
        metavar="STEPS",
        help="a lone waiting prompt too long to ride is computed a few layers at a time, for "
        "STEPS decode steps' time a round between the streams' steps; 0: it rides in smaller "
        "chunks instead (default: 2; docs/adr/0009 shows the curve)",
    )
    serve.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="queued requests before new ones get 429 (default: %(default)s)",
    )
    serve.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds running requests get to finish on SIGTERM",
    )
    serve.set_defaults(handler=run_server)


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    from semantic.adapters.cli.main import settings_from
    from semantic.adapters.http.app import create_app
    from semantic.adapters.storage.data_dir_lock import acquire_data_directory
    from semantic.bootstrap import Services, start_services, stop_services

    overrides: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "api_key": args.api_key or os.environ.get("SEMANTIC_API_KEY") or None,
        "kv_budget_bytes": args.kv_budget_mb << 20,
        "prefault_bytes": max(0, args.prefault_mb) << 20,
        "kv_at_rest": args.kv_at_rest,
        "max_tokens_cap": args.max_tokens_cap,
        "max_waiting": args.max_waiting,
        "grace_s": args.grace,
        "disk_quota_bytes": args.disk_quota_mb << 20 if args.disk_quota_mb else None,
    }
    if args.prefill_budget is not None:
        overrides["prefill_fixed_tokens"] = args.prefill_budget
    if args.prefill_ride is not None:
        overrides["prefill_ride_ratio"] = args.prefill_ride or None
    if args.prefill_slice is not None:
        overrides["prefill_slice_ratio"] = args.prefill_slice or None
    settings = settings_from(args, **overrides)
    # Refuse a directory another server holds now, before the model loads; the hold lasts
    # as long as this process.
    acquire_data_directory(settings.data_dir)
    progress = ProgressPrinter()

    async def start(observer: Any) -> Services:
        return await start_services(settings, progress, observer)

    async def stop(services: Any) -> None:
        await stop_services(services, settings.grace_s)
        # Everything is flushed and closed. Leave now: MLX keeps a C++ stream thread for
        # every Python thread that ran MLX work, and letting the interpreter tear those
        # threads down can abort the process (SIGABRT) after a perfectly clean shutdown.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    app = create_app(start, stop, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes)
    log.info("listening on http://%s:%d", settings.host, settings.port)
    # uvicorn drains on SIGTERM, then re-raises it under the handler it found at start; this
    # one turns that into a clean exit (status 0) once everything is flushed.
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info" if args.log_info else "warning",
        timeout_graceful_shutdown=int(settings.grace_s),
        access_log=False,
    )
    return 0


def _decode_steps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse
