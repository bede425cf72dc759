"""``semantic serve``: the HTTP server on the embedded model (or ``--model``).

The flags are a table (``serve_flags``), read into ``Settings`` by ``serve_settings``; the
checks before the model loads are ``serve_listen``'s; this module runs the server: the app,
uvicorn held to the connection limits, the drain on SIGTERM, and the exit.
"""

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
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from semantic.adapters.cli.descriptors import (
    ACCEPT_BATCH,
    DescriptorLimit,
    raise_descriptor_limit,
)
from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.cli.serve_flags import DEFAULT_MAX_CONNECTIONS, add_flags
from semantic.adapters.cli.serve_listen import (
    keys_and_data_directory,
    listen,
    resolve,
)
from semantic.adapters.cli.serve_settings import check, serve_settings
from semantic.adapters.cli.start_block import start_block
from semantic.domain.errors import SemanticError

if TYPE_CHECKING:
    from semantic.adapters.http.keys import KeyRing
    from semantic.config import Settings

log = logging.getLogger(__name__)

LAST_EVENTS_S = 10
"""How long after ``--grace`` uvicorn still waits for streams to carry their last event."""
KEEP_ALIVE_S = 8
"""How long an idle connection waits for its next request: longer than the 5 s for which
httpx (the transport under the OpenAI and Anthropic SDKs) reuses an idle connection. At
equal times (uvicorn's default is 5 s too) a request sent just as the server closed the
connection met a reset: an agent back from a 5 s tool call, say. Below ``--header-timeout``'s
default (10 s), which bounds an idle connection as well."""
LISTEN_QUEUE = 4096
"""Connections the kernel holds for the server to accept (it caps this at somaxconn): at the
connection limit, a new client waits in it while slow ones are closed for it, rather than
having its connection dropped and retried a second later."""


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``serve`` command, its flags from the table in ``serve_flags``."""
    serve = sub.add_parser("serve", parents=[common], help="run the HTTP server")
    add_flags(serve)
    serve.set_defaults(handler=run_server, parser=serve, check=lambda args: check(serve, args))


def run_server(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; a startup that fails (no model) exits 1, or 2 for a usage
    error, with the reason on stderr once the server is down."""
    settings = serve_settings(args)
    # Fail fast, in this order: a bad host before anything is created; a directory another
    # server holds (its pid is the better message when both use the same port); a port in
    # use. The hold and the sockets last as long as this process; the model loads after.
    addresses = resolve(settings.host, settings.port)
    keys = keys_and_data_directory(settings)
    sockets = listen(addresses, settings.host, settings.port)
    log.info("listening on http://%s:%d", settings.host, settings.port)
    descriptors = raise_descriptor_limit()  # mlx-lm's import cannot lower it again
    failures: list[Exception] = []
    shown = None if args.quiet else sys.stderr
    server = _server(settings, keys, descriptors, failures, log_info=args.log_info, shown=shown)
    # uvicorn drains on SIGTERM, then re-raises it under the handler it found at start; this
    # one turns that into a clean exit (status 0) once everything is flushed.
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets)
    if failures:
        _startup_failed(failures[0])
    return 0


def _startup_failed(error: Exception) -> NoReturn:
    """Say why the server could not start, once it is down: 2 for ours, 1 for the rest."""
    log.debug("startup failed", exc_info=error)
    if isinstance(error, SemanticError):
        print(f"error: {error}", file=sys.stderr)
        _exit(2)
    print(f"error: startup failed: {type(error).__name__}: {error}", file=sys.stderr)
    _exit(1)


def _server(
    settings: Settings,
    keys: KeyRing,
    descriptors: DescriptorLimit,
    failures: list[Exception],
    *,
    log_info: bool,
    shown: TextIO | None,
) -> Any:
    """The uvicorn server on the app; its services start with it (``shown``: where the
    start block goes, None for nowhere), and a startup failure lands in ``failures`` and
    shuts it down."""
    from semantic.bootstrap import Services, start_services, stop_services

    progress = ProgressPrinter()
    started: list[Services] = []

    async def start(observer: Any) -> Services:
        try:
            started.append(await start_services(settings, progress, observer))
            if shown is not None:
                _announce(shown, settings, started[0])
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

    def drain() -> None:
        if started:  # the requests still running when the grace ends are failed
            started[0].loop.drain(settings.grace_s)

    config = _config(settings, keys, descriptors, (start, stop), log_info=log_info)
    server = _draining_server(config, drain)
    return server


def _announce(shown: TextIO, settings: Settings, services: Any) -> None:
    url = f"http://{settings.host}:{settings.port}"
    shown.write(start_block(url, services.model_id, services.runtime, services.data_dir))
    shown.flush()


def _config(
    settings: Settings,
    keys: KeyRing,
    descriptors: DescriptorLimit,
    hooks: tuple[Callable[[Any], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    *,
    log_info: bool,
) -> Any:
    """uvicorn's config for the app (``hooks``: its services' start and stop)."""
    import uvicorn  # these imports take a second or two: after the checks

    from semantic.adapters.http.app import create_app

    app = create_app(
        *hooks,
        api_key=settings.api_key,
        max_body_bytes=settings.max_body_bytes,
        cors_origins=settings.cors_origins,
        keys=keys,
        allowed_hosts=(settings.host, *settings.allowed_hosts),
    )
    return uvicorn.Config(
        app,
        http=_guarded_protocol(settings, descriptors),
        backlog=ACCEPT_BATCH,
        log_config=None,  # its lines go through the root handler: one format, repeats filtered
        log_level="info" if log_info else "warning",
        # Past the grace, the engine fails what is left at its next step (a long prefill
        # step takes seconds): connections get that long to carry the error event out.
        timeout_graceful_shutdown=math.ceil(settings.grace_s) + LAST_EVENTS_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        access_log=False,
    )


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


def _exit(code: int) -> NoReturn:
    """Leave now, everything flushed. MLX keeps a C++ stream thread for every Python thread
    that ran MLX work, and letting the interpreter tear those threads down can abort the
    process (SIGABRT) after a perfectly clean shutdown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
