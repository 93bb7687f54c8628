"""The command's own diagnosis in `$VIGIL_STATUS_FILE` (design §3). Pure parsing."""

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError


class StatusReport(BaseModel):
    """`{"status": "success" | "recoverable" | "fatal", "message": "...", "resume": {...}}`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    status: Literal["success", "recoverable", "fatal"]
    message: str = ""
    resume: dict[str, Any] | None = None


def read_status(path: Path) -> StatusReport | None:
    """The report at `path`; None if there is none; a malformed file reads as `fatal`."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return StatusReport.model_validate_json(text)
    except ValidationError as exc:
        return StatusReport(status="fatal", message=f"unreadable status file: {exc}")
