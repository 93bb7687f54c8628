"""`python -m services.pilot`: a batch job's command (see the package)."""

import asyncio
import logging
import sys

from services.pilot.allocation import NotInAllocation
from services.pilot.main import run
from services.pilot.settings import PilotSettings
from services.settings_catalog import warn_unknown_settings
from shared.runtime.logs import configure_logging


def main() -> None:
    settings = PilotSettings()
    configure_logging("pilot", settings.log_level)
    warn_unknown_settings()
    try:
        sys.exit(asyncio.run(run(settings)))
    except NotInAllocation as exc:
        logging.getLogger("services.pilot").critical("cannot start: %s", exc)
        sys.exit(2)


if __name__ == "__main__":
    main()
