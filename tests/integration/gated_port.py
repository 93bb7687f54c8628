"""A loopback port in front of a real server that a test opens and shuts: shut, it accepts each
connection and closes it at once (a server that is down or restarting, as its clients meet
it); open, it relays each connection to the server. It counts the connections it refused, so
that a test waits for a client to have tried (and tried again) instead of sleeping."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class GatedPort:
    """The gate (see the module's docstring); `url` is where clients reach it."""

    target_host: str
    target_port: int
    is_open: bool = False
    refused: int = 0
    port: int = 0
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _relayed: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        self.is_open = True

    async def refusals(self, count: int, within: float = 20.0) -> None:
        """Return once at least `count` connections were refused."""
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(lambda: self.refused >= count)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.is_open:
            writer.close()
            async with self._changed:
                self.refused += 1
                self._changed.notify_all()
            return
        up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        self._relayed |= {writer, up_writer}
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def close_relayed(self) -> None:
        for writer in self._relayed:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(ConnectionError):
            writer.close()


@contextlib.asynccontextmanager
async def gated_port(target_host: str, target_port: int) -> AsyncIterator[GatedPort]:
    """A shut gate to `target_host:target_port` on a free loopback port, while the block runs."""
    gate = GatedPort(target_host, target_port)
    server = await asyncio.start_server(gate._serve, "127.0.0.1", 0)
    gate.port = server.sockets[0].getsockname()[1]
    try:
        yield gate
    finally:
        server.close()
        gate.close_relayed()  # a client's pooled connections would hold the server open
        await server.wait_closed()
