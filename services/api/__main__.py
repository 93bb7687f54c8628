"""`python -m services.api`: serve the api with uvicorn (which stops gracefully on SIGTERM)."""

import asyncio
import contextlib
import math
import socket
import sys
from types import FrameType

import uvicorn
from pydantic import ValidationError

from services.api.app import create_app
from services.api.event_hub import EventHub
from services.api.settings import ApiSettings
from services.settings_catalog import warn_unknown_settings
from shared.runtime.logs import configure_logging

#: Seconds an idle client connection is kept open.
_KEEP_ALIVE_S = 75


def main() -> None:
    """Read the settings once, configure logging, and serve until SIGTERM/SIGINT."""
    try:
        settings = ApiSettings()
    except ValidationError as exc:
        sys.exit(f"invalid api settings: {exc}")
    configure_logging("api", settings.log_level)
    warn_unknown_settings()
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,  # keep the records in our one-line format (configure_logging)
        timeout_graceful_shutdown=math.ceil(settings.graceful_timeout_s),
        server_header=False,
        # Longer than any client keeps an idle connection (httpx: 5 s): a client that reuses
        # one as uvicorn's default 5 s closes it gets a reset instead of an answer.
        timeout_keep_alive=_KEEP_ALIVE_S,
        loop="uvloop",  # as the scheduler (shared.runtime.event_loop)
        http="httptools",  # C's HTTP parser, not h11's Python
    )
    _Server(config, app.state.events).run()


class _Server(uvicorn.Server):
    """Ends the live event streams when shutting down: they never end by themselves, and
    would otherwise hold the graceful shutdown for its whole timeout.

    Its main loop sleeps a second at a time, woken at once by a signal: uvicorn's own wakes
    ten times a second to look for one (most of an idle api's CPU)."""

    def __init__(self, config: uvicorn.Config, hub: EventHub) -> None:
        super().__init__(config)
        self._hub = hub
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._wake, self._loop = asyncio.Event(), asyncio.get_running_loop()
        # Counter 0: uvicorn refreshes the date header at every tick of a multiple of ten.
        while not await self.on_tick(0):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_TICK_S):
                    await self._wake.wait()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._hub.close()
        await super().shutdown(sockets)


#: How often the main loop looks at the time (the `date` header) when nothing wakes it.
_TICK_S = 1.0


if __name__ == "__main__":
    main()
