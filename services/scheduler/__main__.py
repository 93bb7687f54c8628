"""`python -m services.scheduler`."""

from services.scheduler.main import main
from services.scheduler.settings import SchedulerSettings
from shared.runtime import event_loop
from shared.runtime.logs import configure_logging


def run() -> None:
    settings = SchedulerSettings()
    configure_logging("scheduler", settings.log_level)
    event_loop.run(main(settings))


if __name__ == "__main__":
    run()
