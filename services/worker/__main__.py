"""`python -m services.worker`."""

import asyncio
import logging
import sys

from services.settings_catalog import warn_unknown_settings
from services.worker.confinement import CannotConfine
from services.worker.main import main
from services.worker.settings import WorkerSettings
from shared.host.private_dir import UnsafeDir
from shared.host.uid_ranges import UidRangeHeld
from shared.runtime.logs import configure_logging


def run() -> None:
    settings = WorkerSettings()
    configure_logging("worker", settings.log_level)
    warn_unknown_settings()
    try:
        asyncio.run(main(settings))
    except (CannotConfine, UidRangeHeld, UnsafeDir) as exc:  # a setting to change: one line
        logging.getLogger("services.worker").critical("cannot start: %s", exc)
        sys.exit(1)


if __name__ == "__main__":
    run()
