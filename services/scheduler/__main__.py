"""`python -m services.scheduler`."""

import logging
import sys

from services.scheduler.main import main
from services.scheduler.settings import SchedulerSettings
from services.settings_catalog import warn_unknown_settings
from shared.host.private_dir import UnsafeDir
from shared.runtime import event_loop
from shared.runtime.logs import configure_logging


def run() -> None:
    settings = SchedulerSettings()
    configure_logging("scheduler", settings.log_level)
    warn_unknown_settings()
    try:
        event_loop.run(main(settings))
    except UnsafeDir as exc:  # a setting to change (VIGIL_PILOTS_DIR), not a bug: one line
        logging.getLogger("services.scheduler").critical("cannot start: %s", exc)
        sys.exit(1)


if __name__ == "__main__":
    run()
