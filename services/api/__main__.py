"""`python -m services.api`: serve the api with uvicorn (which stops gracefully on SIGTERM)."""

import math
import socket
import sys

import uvicorn
from pydantic import ValidationError

from services.api.app import create_app
from services.api.event_hub import EventHub
from services.api.settings import ApiSettings
from shared.logs import configure_logging


def main() -> None:
    """Read the settings once, configure logging, and serve until SIGTERM/SIGINT."""
    try:
        settings = ApiSettings()
    except ValidationError as exc:
        sys.exit(f"invalid api settings: {exc}")
    configure_logging("api", settings.log_level)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,  # keep the records in our one-line format (configure_logging)
        timeout_graceful_shutdown=math.ceil(settings.graceful_timeout_s),
        server_header=False,
    )
    _Server(config, app.state.events).run()


class _Server(uvicorn.Server):
    """Ends the live event streams when shutting down: they never end by themselves, and
    would otherwise hold the graceful shutdown for its whole timeout."""

    def __init__(self, config: uvicorn.Config, hub: EventHub) -> None:
        super().__init__(config)
        self._hub = hub

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._hub.close()
        await super().shutdown(sockets)


if __name__ == "__main__":
    main()
