"""The event loop the services run on: uvloop's (libuv's), not asyncio's own.

The same asyncio API, its loop machinery in C: each wake-up, callback, socket read and timer
costs less, and a task's path is thousands of them across the four services (the api's CPU per
submission 20 % less with uvicorn's httptools parser, issue 12). The tests run on asyncio's
loop; the end-to-end tests start the services, so both are exercised.
"""

from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on a new uvloop event loop (as `asyncio.run` would)."""
    return uvloop.run(main)
