"""`python -m services.worker`."""

import asyncio
import logging
import sys

from services.worker.confinement import CannotConfine
from services.worker.main import main
from services.worker.settings import WorkerSettings
from shared.runtime.logs import configure_logging


def run() -> None:
    settings = WorkerSettings()
    configure_logging("worker", settings.log_level)
    try:
        asyncio.run(main(settings))
    except CannotConfine as exc:  # a setting to change, not a bug: said in one line
        logging.getLogger("services.worker").critical("cannot start: %s", exc)
        sys.exit(1)


if __name__ == "__main__":
    run()
