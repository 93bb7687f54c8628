"""A network link a test can cut: TCP relays to the real servers, one per server and host, run
on an event loop of their own (in a thread), so that the test's own loop and blocking calls
never stall them."""

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")


class _Relay:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up = True
        self.writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if not self.up:
            client_w.close()
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self.writers |= {client_w, server_w}
        try:
            await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w))
        finally:
            for writer in (client_w, server_w):
                writer.close()
                self.writers.discard(writer)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    def cut(self) -> None:
        self.up = False
        for writer in list(self.writers):
            transport = writer.transport
            transport.abort()  # a reset, not a goodbye: like a link that went down


class Link:
    """Relays for one host's PostgreSQL, RabbitMQ and Redis URLs; `cut()` severs every
    connection and refuses new ones until `heal()`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, urls: dict[str, str]) -> None:
        self._loop = loop
        self._relays: list[_Relay] = []
        self._servers: list[asyncio.Server] = []
        self.urls: dict[str, str] = {}
        for name, url in urls.items():
            parts = urlsplit(url)
            relay = _Relay((parts.hostname or "127.0.0.1", parts.port or 0))
            self._servers.append(self._on_loop(relay.start()))
            self._relays.append(relay)
            userinfo = parts.netloc.rpartition("@")[0]
            where = f"127.0.0.1:{relay.port}"
            self.urls[name] = urlunsplit(
                parts._replace(netloc=f"{userinfo}@{where}" if userinfo else where)
            )

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def cut(self) -> None:
        self._on_loop(self._set(up=False))

    def heal(self) -> None:
        self._on_loop(self._set(up=True))

    def close(self) -> None:
        self._on_loop(self._close())

    async def _set(self, *, up: bool) -> None:
        for relay in self._relays:
            if up:
                relay.up = True
            else:
                relay.cut()

    async def _close(self) -> None:
        await self._set(up=False)
        for server in self._servers:
            server.close()
            await server.wait_closed()


@contextmanager
def link_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, for `Link`s; stopped on exit (close the
    links first)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="links", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
