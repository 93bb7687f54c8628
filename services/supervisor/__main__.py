"""`python -m services.supervisor`."""

import asyncio

from services.settings_catalog import warn_unknown_settings
from services.supervisor.main import main
from services.supervisor.settings import SupervisorSettings
from shared.runtime.logs import configure_logging


def run() -> None:
    settings = SupervisorSettings()
    configure_logging("supervisor", settings.log_level)
    warn_unknown_settings()
    asyncio.run(main(settings))


if __name__ == "__main__":
    run()
