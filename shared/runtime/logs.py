"""Logging setup shared by the services: one line per event, `extra` fields appended."""

import logging
import re
import sys
from typing import Any, Final

_STANDARD: Final = frozenset(vars(logging.makeLogRecord({})).keys()) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's coloured copy of the message
}


#: Control characters (C0, DEL, C1): a job's text in a message (a brief, a name) must not
#: move the terminal of whoever reads the log, nor forge a line of its own.
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE: Final = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _escape(text: str, pattern: re.Pattern[str] = _CONTROL) -> str:
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class _Formatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return _escape(super().formatException(ei), _CONTROL_BUT_NEWLINE)

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if extras:
            base += " " + " ".join(f"{k}={_escape(str(v))}" for k, v in sorted(extras.items()))
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
