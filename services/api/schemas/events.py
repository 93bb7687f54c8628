"""Views of `/jobs/{id}/events`: the numbered history of a job's events."""

from typing import Any

from pydantic import (
    BaseModel,
)


class EventPublic(BaseModel):
    """One event of the history: its position, routing key and body (with `seq`)."""

    seq: int
    routing_key: str
    body: dict[str, Any]


class EventsPage(BaseModel):
    """One page of a job's events; pass `next` back (as `after` oldest first, `before` newest
    first) for the next page (null: this one was the last)."""

    items: list[EventPublic]
    next: int | None
