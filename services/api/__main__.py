"""`python -m services.api`: serve the api with uvicorn (which stops gracefully on SIGTERM)."""

import math
import sys

import uvicorn
from pydantic import ValidationError

from services.api.app import create_app
from services.api.settings import ApiSettings
from shared.logs import configure_logging


def main() -> None:
    """Read the settings once, configure logging, and serve until SIGTERM/SIGINT."""
    try:
        settings = ApiSettings()
    except ValidationError as exc:
        sys.exit(f"invalid api settings: {exc}")
    configure_logging("api", settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,  # keep the records in our one-line format (configure_logging)
        timeout_graceful_shutdown=math.ceil(settings.graceful_timeout_s),
        server_header=False,
    )


if __name__ == "__main__":
    main()
