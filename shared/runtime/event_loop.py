"""The event loop of the scheduler and the api: uvloop's (libuv's), not asyncio's own.

The same asyncio API, its loop machinery in C: each wake-up, callback, socket read and timer
costs less (the api's CPU per submission 20 % less, with uvicorn's httptools parser;
the scheduler's 11 % less). Both only talk to servers over sockets.

The worker and the supervisor stay on asyncio's loop. The worker reads its commands' pipes
(`connect_read_pipe`) and watches pidfds (`add_reader`) whose descriptors `subprocess` also
holds and closes: under load uvloop still counted a closed pipe's descriptor as its own when
the number came back for the next command's pipe or pidfd, and the spawn failed (`EEXIST`, "file
descriptor is used by transport"): 1,837 of 2,000 W1 jobs failed to set up. The supervisor
watches pidfds the same way. The tests run on asyncio's loop; the end-to-end tests start the
services, so both loops are exercised.
"""

from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on a new uvloop event loop (as `asyncio.run` would)."""
    return uvloop.run(main)
