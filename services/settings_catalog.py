"""Every service's settings model: the one list the start-up check of `VIGIL_*` variables
and the settings reference (`services/settings_reference.py`) are made from."""

import logging
import os
from collections.abc import Mapping
from typing import Final

from services.api.settings import ApiSettings
from services.pilot.settings import PilotSettings
from services.scheduler.settings import SchedulerSettings
from services.supervisor.settings import SupervisorSettings
from services.worker.settings import WorkerSettings
from shared.runtime.config import ENV_PREFIX, VigilSettings
from shared.runtime.settings_names import READ_ELSEWHERE, unknown_settings

#: Each service (the `python -m services.<name>` it runs as) and its settings.
SERVICES: Final[Mapping[str, type[VigilSettings]]] = {
    "api": ApiSettings,
    "scheduler": SchedulerSettings,
    "worker": WorkerSettings,
    "supervisor": SupervisorSettings,
    "pilot": PilotSettings,
}


def env_name(field: str) -> str:
    """The variable a setting is read from."""
    return f"{ENV_PREFIX}{field.upper()}"


def known_variables() -> frozenset[str]:
    """Every `VIGIL_*` variable Vigil reads or sets: all services' settings, and the rest."""
    settings = {env_name(field) for model in SERVICES.values() for field in model.model_fields}
    return frozenset(settings | set(READ_ELSEWHERE))


def warn_unknown_settings(environ: Mapping[str, str] = os.environ) -> None:
    """Log a warning, at a service's start, for each `VIGIL_*` variable nothing reads."""
    log = logging.getLogger("services.settings")
    for warning in unknown_settings(environ, known_variables()):
        log.warning("%s", warning)
