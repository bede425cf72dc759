"""``semantic serve``: the HTTP server on the embedded model (or ``--model``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from semantic.adapters.cli import flags
from semantic.adapters.cli.descriptors import (
    ACCEPT_BATCH,
    RESERVED,
    DescriptorLimit,
    raise_descriptor_limit,
)
from semantic.adapters.cli.progress import ProgressPrinter
from semantic.config import Settings, default_data_dir
from semantic.domain.errors import SemanticError

if TYPE_CHECKING:
    from semantic.adapters.http.keys import KeyRing
    from semantic.config import Settings

log = logging.getLogger(__name__)

PREFAULT_MB = 1024
ALLOWED_HOSTS_ENV = "SEMANTIC_ALLOWED_HOSTS"
DATABASE_URL_ENV = "SEMANTIC_DATABASE_URL"
SHARED_BLOCKS_ENV = "SEMANTIC_SHARED_BLOCKS"
LAST_EVENTS_S = 10
"""How long after ``--grace`` uvicorn still waits for streams to carry their last event."""
DEFAULT_MAX_CONNECTIONS = 4096
LISTEN_QUEUE = 4096
"""Connections the kernel holds for the server to accept (it caps this at somaxconn): at the
connection limit, a new client waits in it while slow ones are closed for it, rather than
having its connection dropped and retried a second later."""


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    serve = sub.add_parser("serve", parents=[common], help="run the HTTP server")
    serve.add_argument(
        "--data-dir",
        type=flags.path,
        default=default_data_dir(),
        help="where KV blocks and the database live (default: %(default)s)",
    )
    serve.add_argument(
        "--database-url",
        type=flags.database_url,
        default=None,
        metavar="URL",
        help="keep agents, transcripts and block metadata in this database instead of "
        "SQLite in the data directory: postgresql+asyncpg://USER:PASSWORD@HOST/DB, shared by "
        f"the instances of a cluster (default: ${DATABASE_URL_ENV}, else SQLite)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    serve.add_argument("--port", type=flags.port, default=8000, help="port (default: %(default)s)")
    serve.add_argument(
        "--api-key",
        type=flags.non_empty,
        default=None,
        help="require this key (Authorization: Bearer, or x-api-key) on every "
        "route but /health, an admin key: any namespace; default: $SEMANTIC_API_KEY (which "
        "keeps it out of the process list), else none",
    )
    serve.add_argument(
        "--api-keys-file",
        type=flags.path,
        default=None,
        metavar="PATH",
        help="API keys, hashed, each bound to a namespace (`semantic keys add NAMESPACE "
        "--file PATH` makes one); a key works in its namespace only (default: "
        "$SEMANTIC_API_KEYS_FILE, else none)",
    )
    serve.add_argument(
        "--allowed-host",
        type=flags.non_empty,
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients reach the server by, besides loopback names, IP addresses "
        "and --host; other Host headers get 421 (DNS rebinding); repeatable; '*': any "
        "(default: $SEMANTIC_ALLOWED_HOSTS, comma-separated, else none)",
    )
    serve.add_argument(
        "--cors-origin",
        type=flags.non_empty,
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from ORIGIN (such as http://localhost:3000, or *) call the "
        "server from a browser; repeatable (default: none)",
    )
    serve.add_argument(
        "--kv-budget-mb",
        type=flags.positive_int,
        default=2048,
        help="memory for KV blocks, MiB; a restored prefix that cannot sit beside its copy "
        "may add up to one prefix until copied (default: %(default)s)",
    )
    serve.add_argument(
        "--prefault-mb",
        type=flags.non_negative_int,
        default=None,
        help="memory touched at start so the first restores after a restart do not page-fault,"
        f" MiB; at most the KV budget; 0 turns it off (default: {PREFAULT_MB}, or the KV budget"
        " if smaller)",
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
        type=flags.positive_int,
        default=None,
        help="disk for KV blocks, MiB: least recently used agents' blocks go first, then the "
        "end of the conversation saved last; up to 4 spare block files (~12 MB each here) "
        "are kept beside it to be written over (default: no quota)",
    )
    serve.add_argument(
        "--shared-blocks",
        type=flags.redis_url,
        default=None,
        metavar="URL",
        help="a Redis URL (redis://host:port/db) whose blocks instances share: new blocks are "
        "pushed there after each save, and restores read what this disk lacks from it; "
        "Redis down, the server serves from its own tiers (default: $SEMANTIC_SHARED_BLOCKS, "
        "else none)",
    )
    serve.add_argument(
        "--disk-reserve-mb",
        type=flags.non_negative_int,
        default=1024,
        help="free disk to keep, MiB: when less is left, least recently used agents' blocks "
        "go first, so transcripts can still be saved (below 8 MiB free, no block file is "
        "written at all); 0: none (default: %(default)s)",
    )
    serve.add_argument(
        "--max-tokens-cap",
        type=flags.positive_int,
        default=4096,
        help="largest max_tokens a request may ask for (default: %(default)s)",
    )
    serve.add_argument(
        "--prefill-budget",
        type=flags.positive_int,
        default=None,
        help="a fixed number of prompt tokens prefilled per engine step (default: 1,024 "
        "while nothing decodes, 64 per waiting prompt while streams decode; docs/adr/0009)",
    )
    serve.add_argument(
        "--prefill-ride",
        type=flags.non_negative_float,
        default=None,
        metavar="STEPS",
        help="a lone waiting prompt's chunk that fits the running streams' decode step (any "
        "chunk, with --prefill-slice 0) rides it, adding at most STEPS decode steps' time; "
        "fewer STEPS: smoother streams, a slower first token for the prompt; 0: passes of "
        "its own (default: 3; docs/adr/0009 shows the curve)",
    )
    serve.add_argument(
        "--prefill-slice",
        type=flags.non_negative_float,
        default=None,
        metavar="STEPS",
        help="a lone waiting prompt too long to ride is computed a few layers at a time "
        "between and beside the streams' decode steps, each round held to 1 + STEPS of their "
        "steps as they were before it came; 0: it rides in smaller chunks instead (default: "
        "1.8; docs/adr/0009 shows the curve)",
    )
    serve.add_argument(
        "--prefill-idle-slice",
        type=flags.non_negative_float,
        default=None,
        metavar="SECONDS",
        help="with nothing decoding, a lone long prompt is computed a few layers at a time, "
        "SECONDS a round, so a request arriving meanwhile starts within about that long; "
        "0: whole 1,024-token rounds, a few percent faster alone (default: 0.25)",
    )
    serve.add_argument(
        "--max-waiting",
        type=flags.positive_int,
        default=256,
        help="queued requests before new ones get 429 (default: %(default)s)",
    )
    serve.add_argument(
        "--max-connections",
        type=flags.positive_int,
        default=None,
        help="connections held at once; past it, the one slowest to send its request is "
        "closed for the new one, or, when all hold requests being answered, the new one gets "
        f"503 (default: what the descriptor limit allows, {RESERVED} kept for the server's "
        f"own files, up to {DEFAULT_MAX_CONNECTIONS})",
    )
    serve.add_argument(
        "--header-timeout",
        type=flags.positive_float,
        default=10.0,
        metavar="SECONDS",
        help="a request's headers must arrive within this long, or its connection is closed "
        "with 408 (default: %(default)s)",
    )
    serve.add_argument(
        "--body-timeout",
        type=flags.positive_float,
        default=30.0,
        metavar="SECONDS",
        help="a request's body must arrive within this long of its headers, or its connection "
        "is closed with 408 (default: %(default)s)",
    )
    serve.add_argument(
        "--grace",
        type=flags.non_negative_float,
        default=30.0,
        help="seconds running requests get to finish on SIGTERM (default: %(default)s)",
    )
    _lease_flags(serve)
    serve.set_defaults(handler=run_server, parser=serve, check=lambda args: _check(serve, args))


def _lease_flags(serve: argparse.ArgumentParser) -> None:
    """One instance per agent at a time, for instances sharing a database (ADR 0025)."""
    serve.add_argument(
        "--leases",
        action="store_true",
        help="take each agent's lease in the database for its turns, so instances sharing "
        "the database run an agent on one of them at a time",
    )
    serve.add_argument(
        "--lease-seconds",
        type=flags.positive_float,
        default=30.0,
        metavar="SECONDS",
        help="how long an agent's lease lasts unless renewed: how long an agent of a dead "
        "instance waits for another (default: %(default)s)",
    )
    serve.add_argument(
        "--lease-wait",
        type=flags.non_negative_float,
        default=5.0,
        metavar="SECONDS",
        help="how long a request waits for an agent busy on another instance before its 409 "
        "(default: %(default)s)",
    )


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.prefault_mb is not None and args.prefault_mb > args.kv_budget_mb:
        parser.error(
            f"argument --prefault-mb: must be at most the KV budget (--kv-budget-mb "
            f"{args.kv_budget_mb}), not {args.prefault_mb}"
        )


def _prefill_overrides(args: argparse.Namespace) -> dict[str, object]:
    overrides: dict[str, object] = {}
    if args.prefill_budget is not None:
        overrides["prefill_fixed_tokens"] = args.prefill_budget
    if args.prefill_ride is not None:
        overrides["prefill_ride_ratio"] = args.prefill_ride or None
    if args.prefill_slice is not None:
        overrides["prefill_slice_ratio"] = args.prefill_slice or None
    if args.prefill_idle_slice is not None:
        overrides["prefill_idle_slice_s"] = args.prefill_idle_slice or None
    return overrides


def run_server(args: argparse.Namespace) -> int:
    from semantic.adapters.cli.main import settings_from

    prefault_mb = args.prefault_mb if args.prefault_mb is not None else PREFAULT_MB
    overrides: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "api_key": args.api_key or os.environ.get("SEMANTIC_API_KEY") or None,
        "cors_origins": tuple(args.cors_origin),
        "allowed_hosts": _allowed_hosts(args.allowed_host),
        "api_keys_file": args.api_keys_file or _env_path("SEMANTIC_API_KEYS_FILE"),
        "kv_budget_bytes": args.kv_budget_mb << 20,
        "prefault_bytes": min(prefault_mb, args.kv_budget_mb) << 20,
        "kv_at_rest": args.kv_at_rest,
        "max_tokens_cap": args.max_tokens_cap,
        "max_waiting": args.max_waiting,
        "grace_s": args.grace,
        "disk_quota_bytes": None if args.disk_quota_mb is None else args.disk_quota_mb << 20,
        "disk_reserve_bytes": args.disk_reserve_mb << 20,
        "shared_blocks_url": _shared_blocks(args),
        "max_connections": args.max_connections,
        "header_timeout_s": args.header_timeout,
        "body_timeout_s": args.body_timeout,
        "database_url": _database_url(args),
    }
    overrides.update(_prefill_overrides(args))
    overrides.update(leases=args.leases, lease_seconds=args.lease_seconds)
    overrides.update(lease_wait_s=args.lease_wait)
    settings = settings_from(args, **overrides)
    # Fail fast, in this order: a bad host before anything is created; a directory another
    # server holds (its pid is the better message when both use the same port); a port in
    # use. The hold and the sockets last as long as this process; the model loads after.
    addresses = _resolve(settings.host, settings.port)
    keys = _keys_and_data_directory(settings)
    sockets = _listen(addresses, settings.host, settings.port)
    log.info("listening on http://%s:%d", settings.host, settings.port)
    descriptors = _raise_descriptor_limit()

    import uvicorn  # these imports take a second or two: after the checks above

    from semantic.adapters.http.app import create_app
    from semantic.bootstrap import Services, start_services, stop_services

    progress = ProgressPrinter()
    failures: list[Exception] = []

    started: list[Services] = []

    async def start(observer: Any) -> Services:
        try:
            started.append(await start_services(settings, progress, observer))
            return started[0]
        except Exception as error:
            # Without a model there is nothing to serve: shut the server down and say why
            # once it is down. Raising would only log a traceback and leave it up, all 503s.
            failures.append(error)
            server.should_exit = True
            await asyncio.Event().wait()  # the shutdown cancels this
            raise

    async def stop(services: Any) -> None:
        await stop_services(services, settings.grace_s)
        _exit(0)

    app = create_app(
        start,
        stop,
        api_key=settings.api_key,
        max_body_bytes=settings.max_body_bytes,
        cors_origins=settings.cors_origins,
        keys=keys,
        allowed_hosts=(settings.host, *settings.allowed_hosts),
    )
    config = uvicorn.Config(
        app,
        http=_guarded_protocol(settings, descriptors),
        backlog=ACCEPT_BATCH,
        log_config=None,  # its lines go through the root handler: one format, repeats filtered
        log_level="info" if args.log_info else "warning",
        # Past the grace, the engine fails what is left at its next step (a long prefill
        # step takes seconds): connections get that long to carry the error event out.
        timeout_graceful_shutdown=math.ceil(settings.grace_s) + LAST_EVENTS_S,
        access_log=False,
    )

    def drain() -> None:
        if started:  # the requests still running when the grace ends are failed
            started[0].loop.drain(settings.grace_s)

    server = _draining_server(config, drain)
    # uvicorn drains on SIGTERM, then re-raises it under the handler it found at start; this
    # one turns that into a clean exit (status 0) once everything is flushed.
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets)
    if failures:
        error = failures[0]
        log.debug("startup failed", exc_info=error)
        if isinstance(error, SemanticError):
            print(f"error: {error}", file=sys.stderr)
            _exit(2)
        print(f"error: startup failed: {type(error).__name__}: {error}", file=sys.stderr)
        _exit(1)
    return 0


def _keys_and_data_directory(settings: Settings) -> KeyRing:
    """The keys (a bad keys file is said before anything is created), then the data
    directory, private from here on, held by this process."""
    from semantic.adapters.cli.privacy import keep_private
    from semantic.adapters.http.keys import keyring
    from semantic.adapters.storage.data_dir_lock import acquire_data_directory

    keys = keyring(settings.api_key, settings.api_keys_file)
    keep_private(settings.data_dir)
    acquire_data_directory(settings.data_dir)
    return keys


def _allowed_hosts(given: list[str]) -> tuple[str, ...]:
    """``--allowed-host`` names, else ``$SEMANTIC_ALLOWED_HOSTS``'s."""
    listed = given or os.environ.get(ALLOWED_HOSTS_ENV, "").split(",")
    return tuple(name.strip() for name in listed if name.strip())


def _database_url(args: argparse.Namespace) -> str | None:
    """``--database-url``, else ``$SEMANTIC_DATABASE_URL``'s, checked as the flag is."""
    if args.database_url is not None:
        return str(args.database_url)
    value = os.environ.get(DATABASE_URL_ENV)
    if not value:
        return None
    try:
        return flags.database_url(value)
    except argparse.ArgumentTypeError as error:
        parser: argparse.ArgumentParser = args.parser
        parser.error(f"${DATABASE_URL_ENV}: {error}")


def _shared_blocks(args: argparse.Namespace) -> str | None:
    """``--shared-blocks``, else ``$SEMANTIC_SHARED_BLOCKS``'s, checked as the flag is."""
    if args.shared_blocks is not None:
        return str(args.shared_blocks)
    value = os.environ.get(SHARED_BLOCKS_ENV)
    if not value:
        return None
    try:
        return flags.redis_url(value)
    except argparse.ArgumentTypeError as error:
        parser: argparse.ArgumentParser = args.parser
        parser.error(f"${SHARED_BLOCKS_ENV}: {error}")


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def _raise_descriptor_limit() -> DescriptorLimit:
    """The descriptor limit raised to the hard limit, before mlx-lm's import would lower it."""
    from semantic.adapters.mlx.models.descriptor_limit import import_mlx_lm_keeping_descriptor_limit

    limit = raise_descriptor_limit()
    import_mlx_lm_keeping_descriptor_limit()
    return limit


def _guarded_protocol(settings: Settings, descriptors: DescriptorLimit) -> type[asyncio.Protocol]:
    """uvicorn's protocol held to the request deadlines and to as many connections as the
    descriptor limit leaves room for, at most what ``--max-connections`` says."""
    from semantic.adapters.http.guarded_protocol import (
        ConnectionLimits,
        ConnectionTable,
        protocol_for,
    )

    allowed = descriptors.connections_allowed
    wanted = settings.max_connections
    if wanted is not None and wanted > allowed:
        log.warning(
            "--max-connections %d needs more descriptors than the limit leaves: using %d",
            wanted,
            allowed,
        )
    count = min(wanted or DEFAULT_MAX_CONNECTIONS, allowed)
    log.info(
        "up to %d connections; request headers within %g s, bodies within %g s",
        count,
        settings.header_timeout_s,
        settings.body_timeout_s,
    )
    limits = ConnectionLimits(count, settings.header_timeout_s, settings.body_timeout_s)
    return protocol_for(limits, ConnectionTable(count))


def _draining_server(config: Any, drain: Callable[[], None]) -> Any:
    """A uvicorn server whose first SIGTERM (or SIGINT) also starts draining the engine.

    uvicorn gives open connections ``timeout_graceful_shutdown`` to close, then cuts them
    mid-body, and only then runs the app's shutdown (where the engine used to drain): a
    stream still running at the end of the grace stopped with no last event, as a crash
    would. Draining from the signal on fails such requests when the grace ends, so each
    stream closes with an error event and ``[DONE]`` while uvicorn still waits."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            for sock in sockets or ():  # asyncio listened with the accept batch as backlog
                sock.listen(LISTEN_QUEUE)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit:
                threading.Thread(target=drain, name="semantic-drain", daemon=True).start()
            super().handle_exit(sig, frame)

    return DrainingServer(config)


class ListenError(SemanticError):
    """The server cannot listen where ``--host`` and ``--port`` say."""


Address = tuple[socket.AddressFamily, Any]


def _resolve(host: str, port: int) -> list[Address]:
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as error:
        raise ListenError(f"cannot resolve --host {host!r}: {error.strerror}") from None
    return list(dict.fromkeys((family, address) for family, _, _, _, address in found))


def _listen(addresses: list[Address], host: str, port: int) -> list[socket.socket]:
    """Bind and listen on every address, as asyncio's ``create_server`` would."""
    sockets: list[socket.socket] = []
    try:
        for family, address in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen()
    except OSError as error:
        for sock in sockets:
            sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sockets


def _exit(code: int) -> NoReturn:
    """Leave now, everything flushed. MLX keeps a C++ stream thread for every Python thread
    that ran MLX work, and letting the interpreter tear those threads down can abort the
    process (SIGABRT) after a perfectly clean shutdown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
