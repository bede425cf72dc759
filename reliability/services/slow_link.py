"""A TCP link on 127.0.0.1 that can be made slow: what a congested or distant network between
an instance and its stores looks like, without ``tc netem`` (not every kernel has it) or a
network namespace. Every chunk either way waits ``delay_s`` before it is passed on, in
order, so a round trip costs twice that."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from reliability.server import free_port

CHUNK = 65536


class SlowLink:
    """Listens on ``port`` and forwards each connection to ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.delay_s = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> SlowLink:
        self._thread.start()
        opened = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self._server = opened.result(timeout=10)
        return self

    def stop(self) -> None:
        """Its connections cut, its loop ended and closed."""
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._connect, "127.0.0.1", self.port)

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port
            )
        except OSError:  # the store is down: the client sees its connection close
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await reader.read(CHUNK):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                writer.write(chunk)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()
