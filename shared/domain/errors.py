"""Vigil's exception tree.

VigilError
├── InvalidMessage      a wire message that cannot be decoded (dead-lettered, never requeued)
├── InvalidTransition   a state change that is not a row of the transition table
├── StaleState          a compare-and-set found the row in another state (lost a race)
├── NotFound            no such job, task or user (or not visible to the caller)
├── Conflict            the request is valid but the current state does not allow it (with
│                       the next step: a `Refusal`)
└── SchemaOutOfDate     the schema is older than the code: run `python -m shared.store.migrate`

`UNAVAILABLE` is the tuple of errors that a server away for a while (restarting) causes: loops
log them, pause and go on; they never bring a service down.
"""

from dataclasses import dataclass
from typing import Final

import asyncpg
import redis.exceptions

UNAVAILABLE: Final = (
    OSError,  # refused, reset, timed out (ConnectionError and TimeoutError are OSErrors)
    asyncpg.PostgresError,  # includes the connection errors of a restarting PostgreSQL
    asyncpg.InterfaceError,  # a pool connection closed under us
    asyncpg.InternalClientError,  # a connection the server dropped while it sat in the pool
    redis.exceptions.RedisError,  # redis-py's ConnectionError is not the builtin one
)


class VigilError(Exception):
    """Base of every error Vigil raises on purpose."""


class InvalidMessage(VigilError):
    """A message body that is not one of `shared.domain.messages`."""


class InvalidTransition(VigilError):
    """A transition that the table in `shared.domain.states` does not allow."""


class StaleState(VigilError):
    """The row was not in an expected state: someone else changed it first."""


class NotFound(VigilError):
    """The object does not exist or the caller may not see it."""


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused in the current state, and what the caller can do next."""

    why: str
    next_step: str

    def __str__(self) -> str:
        return f"{self.why}; {self.next_step}"


class Conflict(VigilError):
    """The current state does not allow the request: why, and the next step (every 409 of
    the API says both: `detail` the sentence, `next_step` the step alone)."""

    def __init__(self, why: str, *, next_step: str) -> None:
        self.refusal = Refusal(why, next_step)
        super().__init__(str(self.refusal))

    @classmethod
    def of(cls, refusal: Refusal) -> "Conflict":
        return cls(refusal.why, next_step=refusal.next_step)


class SchemaOutOfDate(VigilError):
    """The database has not been migrated to this code's schema version."""


#: What a connection the server dropped raises: closed mid-statement
#: (`PostgresConnectionError`), terminated (`OperatorInterventionError`: 57P01 and kin), or
#: `InternalClientError` ("cannot switch to state 12; another operation (2) is in progress")
#: when the server's goodbye reached an idle pooled connection before its socket closed, so
#: asyncpg still counted it open (MagicStack/asyncpg#1069). Not `InterfaceError`: its
#: `DataError` is a value the client could not encode, which a retry would not cure.
CONNECTION_LOST: Final = (
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
)


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection went away (a server restarting, a network cut): what
    was under way may or may not have committed, and a new connection may work later."""
    if isinstance(exc, asyncpg.DataError):  # a value the client could not encode
        return False
    return isinstance(
        exc, (*CONNECTION_LOST, ConnectionError, TimeoutError, asyncpg.InterfaceError)
    )
