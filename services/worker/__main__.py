"""`python -m services.worker`."""

import asyncio

from services.worker.main import main
from services.worker.settings import WorkerSettings
from shared.runtime.logs import configure_logging


def run() -> None:
    settings = WorkerSettings()
    configure_logging("worker", settings.log_level)
    asyncio.run(main(settings))


if __name__ == "__main__":
    run()
