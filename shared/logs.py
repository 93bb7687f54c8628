"""Logging setup shared by the services: one line per event, `extra` fields appended."""

import logging
import sys
from typing import Final

_STANDARD: Final = frozenset(vars(logging.makeLogRecord({})).keys()) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's coloured copy of the message
}


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if extras:
            base += " " + " ".join(f"{k}={v}" for k, v in sorted(extras.items()))
        return base


def configure_logging(service: str, level: str = "INFO") -> None:
    """Send every record to stderr as `time level service logger: message key=value...`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiormq").setLevel(logging.WARNING)
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
