"""Settings of the api service, read once from `VIGIL_*` environment variables."""

import re
from typing import Final

from pydantic import Field, field_validator

from shared.config import CommonSettings

#: Shortest bootstrap token accepted: a guessable operator token is worse than none.
MIN_TOKEN_CHARS: Final = 16
_TOKEN_RE: Final = re.compile(r"[\x21-\x7e]+")  # visible ASCII: it travels in a header


class ApiSettings(CommonSettings):
    """`VIGIL_API_HOST`, `VIGIL_API_PORT`, `VIGIL_BOOTSTRAP_TOKEN` and the request limits."""

    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    #: When set, the api makes (or keeps) the operator `operator` holding this token.
    bootstrap_token: str | None = None
    #: Larger request bodies are refused with 413, whether or not they declare their length.
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    #: Most inputs (hence tasks) one submission may carry.
    max_inputs: int = Field(default=10_000, ge=1)

    @field_validator("bootstrap_token")
    @classmethod
    def _check_token(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if len(value) < MIN_TOKEN_CHARS or not _TOKEN_RE.fullmatch(value):
            raise ValueError(
                f"VIGIL_BOOTSTRAP_TOKEN must be at least {MIN_TOKEN_CHARS} visible ASCII"
                " characters (no spaces): it travels in an HTTP header"
            )
        return value
