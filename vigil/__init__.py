"""Vigil's client library (`Client`, `AsyncClient`) and command-line client (`vigil.cli`).

Speaks only the HTTP API (design §9), so it imports nothing of the services.
"""

from vigil.async_client import AsyncClient
from vigil.client import Client
from vigil.errors import (
    ApiError,
    BadResponse,
    ConfigError,
    Conflict,
    Forbidden,
    Gone,
    InvalidRequest,
    JobFileError,
    NotFound,
    RateLimited,
    Unauthorized,
    Unreachable,
    UsageError,
    VigilError,
    WaitTimeout,
)
from vigil.sse import Event

__all__ = [
    "ApiError",
    "AsyncClient",
    "BadResponse",
    "Client",
    "ConfigError",
    "Conflict",
    "Event",
    "Forbidden",
    "Gone",
    "InvalidRequest",
    "JobFileError",
    "NotFound",
    "RateLimited",
    "Unauthorized",
    "Unreachable",
    "UsageError",
    "VigilError",
    "WaitTimeout",
]
