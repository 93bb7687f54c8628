"""The command's own diagnosis (design §3), as parsed from `$VIGIL_STATUS_FILE`
(`shared.host.status_file` reads it)."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class StatusReport(BaseModel):
    """`{"status": "success" | "recoverable" | "fatal", "message": "...", "resume": {...}}`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    status: Literal["success", "recoverable", "fatal"]
    message: str = ""
    resume: dict[str, Any] | None = None
